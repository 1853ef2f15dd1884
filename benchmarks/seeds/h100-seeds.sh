# kfuse bench on the seeds (seeds/h100-seeds.json, .png, .log), after the Hopper twins' GPU tests (log not
# kept: 11 passed; gputests/sm90-after-review.log is a later run) and the sweep of problem 39's memory-bound passes
# (batchnorm/pass_sweep.log).
# Ran at code eb62626 on an H100 (the device machine: OUT is its output folder), from the repository root.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_sm90.py > $OUT/pytest-gpu-sm90-early.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Error" $OUT/pytest-gpu-sm90-early.log | tail -14
timeout 60 python3 benchmarks/batchnorm/pass_sweep.py --rounds 40 > $OUT/pass_sweep.log 2>&1; cat $OUT/pass_sweep.log | tail -12
bash benchmarks/gpu_run.sh seeds $OUT
rm -rf $OUT/cache
