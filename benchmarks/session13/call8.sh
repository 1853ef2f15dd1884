# session 13, call 8: GPU tests of the two-forward Dropout models (mode switches with a graphed eval forward)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 300 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_modes.py tests/test_graphs.py > $OUT/pytest-gpu-modes.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Error" $OUT/pytest-gpu-modes.log | tail -12
