# session 12, call 4: kfuse bench --train on the three seeds after gemm_dw_presplit (code 430e5e0)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
KFUSE_BENCH_TIMEOUT=570 bash benchmarks/gpu_run.sh train $OUT/r | tail -16
rm -f $OUT/r/cache/inductor.tgz
