# The model-level GPU test of dW from the forward's split, at untuned (pre-split) configs
# (gputests/training-kn-untuned.log). Ran at code 9cbe3e8 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_training_fast.py -k "in_a_model" > $OUT/pytest-gpu.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|^E " $OUT/pytest-gpu.log | tail -14
