# v6 of train/NOTES.md (the training forward writes z alone, FROM_Z): seed 39's step time (train/step_time-v6.log),
# then kfuse bench --train on 39 alone (train/h100-train-39-v6.json, .png, .log), which checks the gradient contract at
# full size; 12 and 62 have no BatchNorm region. Ran at code 9dcb9c5 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
timeout 50 python3 benchmarks/train/step_time.py problems/seeds/39_gemm_scale_batchnorm.py 2>&1 | grep -v -i warn | tail -3 | tee $OUT/step_time.log
mkdir -p $OUT/r
timeout 205 python3 -m kfuse bench --train problems/seeds/39_gemm_scale_batchnorm.py --json $OUT/r/h100-train-39.json --plot $OUT/r/h100-train-39.png > $OUT/r/train-39.log 2>&1; tail -8 $OUT/r/train-39.log
