# session 15, call 4: every GPU test (pytest -m gpu) but tests/test_training_fast.py (call 5), at the code of call 3
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 560 python3 -m pytest -v -p no:cacheprovider -m gpu tests --deselect tests/test_training_fast.py > $OUT/pytest-gpu-all-session15.log 2>&1
grep -E "FAILED|ERROR|passed|failed" $OUT/pytest-gpu-all-session15.log | tail -14
