# kfuse bench --train on the three seeds (train/h100-train.json, .png, .log): dW from the forward's split of x
# (v7 in train/NOTES.md). Ran at code 430e5e0 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
KFUSE_BENCH_TIMEOUT=570 bash benchmarks/gpu_run.sh train $OUT/r | tail -16
rm -f $OUT/r/cache/inductor.tgz
