# v5 of train/NOTES.md (dZ kernels over row tiles, dZ's column maxima, merged BatchNorm passes): the training
# path's GPU tests (gputests/training-dz-tiles.log), seed 39's step profile (train/step_profile-v5.log), then
# kfuse bench --train on the seeds (train/h100-train-v5.json, .png). Ran at code 2cb7566 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
bash benchmarks/gpu_run.sh gputests $OUT/t tests/test_training_fast.py tests/test_graphs.py | tail -12
rm -rf $OUT/t/cache
timeout 90 python3 benchmarks/train/step_profile.py problems/seeds/39_gemm_scale_batchnorm.py 2>&1 | grep -v -i warn | tee $OUT/step_profile.log | head -12
KFUSE_BENCH_TIMEOUT=400 bash benchmarks/gpu_run.sh train $OUT/r | tail -14
rm -f $OUT/r/cache/inductor.tgz; tar czf $OUT/r/cache.tgz -C $OUT/r cache && rm -rf $OUT/r/cache
