# session 12, call 9: kfuse bench --train on seed 39 alone at the session's final code (a second sample of the
# seed closest to the 3x goal; 12 and 62 keep call 4's rows)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
mkdir -p $OUT/r
timeout 300 python3 -m kfuse bench --train problems/seeds/39_gemm_scale_batchnorm.py --json $OUT/r/h100-train-39.json --plot $OUT/r/h100-train-39.png > $OUT/r/train-39.log 2>&1; tail -8 $OUT/r/train-39.log
