# session 13, calls 4-6: kfuse bench on the problems whose kernels changed with the accurate tanh
# (runtime._tanh) and the float64 logsumexp of softmax / log_softmax / logsumexp regions (chunks 9-11)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
KFUSE_BENCH_TIMEOUT=560 bash benchmarks/gpu_run.sh gemm $OUT/b "$@" 2>&1 | tail -9
rm -f $OUT/b/cache/inductor.tgz
