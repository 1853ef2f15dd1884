# session 15, call 6: tests/test_sm90.py's GPU tests after the review's refactor of the tail split (same arithmetic)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_sm90.py > $OUT/pytest-gpu-sm90-review-session15.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Error" $OUT/pytest-gpu-sm90-review-session15.log | tail -14
