# kfuse bench on the problems/gemm files given as arguments (benchmarks/gpu_run.sh gemm). Made
# gemm-family/h100-accurate-tanh-f64-lse-1.* and -2.* (code fc6d741: the problems whose kernels the accurate tanh and
# the float64 logsumexp changed) and gemm-family/h100-lse-hilo-branch.* (branch lse-hilo, 0075197), on an H100,
# OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
KFUSE_BENCH_TIMEOUT=560 bash benchmarks/gpu_run.sh gemm $OUT/b "$@" 2>&1 | tail -9
rm -f $OUT/b/cache/inductor.tgz
