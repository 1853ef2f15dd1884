# Every GPU test (pytest -m gpu tests) at the code of train/h100-train.json (gputests/all-dw-presplit.log; this
# run stopped at its time limit inside tests/test_skinny.py, whose 3 remaining tests were run alone after it).
# Ran at code 430e5e0 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TRITON_INTERPRET=0 timeout 480 python3 -m pytest -v -p no:cacheprovider -m gpu tests > $OUT/pytest-gpu.log 2>&1
grep -E "FAILED|ERROR|passed|failed" $OUT/pytest-gpu.log | tail -20
