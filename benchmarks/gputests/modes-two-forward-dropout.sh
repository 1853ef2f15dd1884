# GPU tests of the two-forward Dropout models: mode switches with a graphed eval forward
# (gputests/modes-two-forward-dropout.log). Ran at code 9aee685 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 300 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_modes.py tests/test_graphs.py > $OUT/pytest-gpu-modes.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Error" $OUT/pytest-gpu-modes.log | tail -12
