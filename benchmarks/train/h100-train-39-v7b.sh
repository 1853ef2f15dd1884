# kfuse bench --train on seed 39 alone after v7b of train/NOTES.md (`x @ W` regions' dW from the forward's split):
# a second sample of the seed closest to the 3x goal (train/h100-train-39-v7b.json, .png, .log). Ran at code
# 67ad4ce on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
mkdir -p $OUT/r
timeout 300 python3 -m kfuse bench --train problems/seeds/39_gemm_scale_batchnorm.py --json $OUT/r/h100-train-39.json --plot $OUT/r/h100-train-39.png > $OUT/r/train-39.log 2>&1; tail -8 $OUT/r/train-39.log
