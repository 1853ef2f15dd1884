# session 15, call 3: at the commit with the early promotion wait as the only one and the tuner interleaving its
# candidates: GPU tests of the twins, the memory-bound passes of 39 swept (benchmarks/batchnorm/pass_sweep.py),
# then kfuse bench on the seeds
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_sm90.py > $OUT/pytest-gpu-sm90-early.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Error" $OUT/pytest-gpu-sm90-early.log | tail -14
timeout 60 python3 benchmarks/batchnorm/pass_sweep.py --rounds 40 > $OUT/pass_sweep.log 2>&1; cat $OUT/pass_sweep.log | tail -12
bash benchmarks/gpu_run.sh seeds $OUT
rm -rf $OUT/cache
