# Every GPU test but tests/test_training_fast.py (gputests/training-early-wait.log has those) at the code of
# seeds/h100-seeds.json (gputests/all-but-training-early-wait.log). Ran at code eb62626 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 560 python3 -m pytest -v -p no:cacheprovider -m gpu tests --deselect tests/test_training_fast.py > $OUT/pytest-gpu.log 2>&1
grep -E "FAILED|ERROR|passed|failed" $OUT/pytest-gpu.log | tail -14
