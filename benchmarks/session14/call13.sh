# session 14, call 13: the GPU tests call 12 had no time left for (tests/test_training_fast.py: training steps with the twin in the forward)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 540 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_training_fast.py > $OUT/pytest-gpu-training-session14.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/pytest-gpu-training-session14.log | tail -14
