# session 12, call 5: every GPU test (pytest -m gpu tests) on the final code of the session
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TRITON_INTERPRET=0 timeout 480 python3 -m pytest -v -p no:cacheprovider -m gpu tests > $OUT/pytest-gpu.log 2>&1
grep -E "FAILED|ERROR|passed|failed" $OUT/pytest-gpu.log | tail -20
