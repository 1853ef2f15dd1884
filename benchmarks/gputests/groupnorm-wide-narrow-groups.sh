# The two-phase GroupNorm's GPU tests, groups of 9 and 3 compiled among them, and the CUDA graph tests
# (gputests/groupnorm-wide-narrow-groups.log). Ran at code 0df0ba9 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_groupnorm_wide.py tests/test_graphs.py > $OUT/pytest-gpu-narrow.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/pytest-gpu-narrow.log | tail -14
