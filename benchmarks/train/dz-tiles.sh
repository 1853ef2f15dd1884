# dZ kernels over row tiles (v5a of train/NOTES.md): every tile choice of benchmarks/train/dz_tiles.py on the seeds
# (train/dz_tiles-v5a.log), then seed 39's step profile (train/step_profile-v5a-tiles.log). Ran at code 9c7baff (the
# commit that added these scripts; v5's other changes came in 2cb7566) on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
for p in 39_gemm_scale_batchnorm 62_matmul_groupnorm_leakyrelu_sum 12_gemm_multiply_leakyrelu; do
  timeout 150 python3 benchmarks/train/dz_tiles.py problems/seeds/$p.py 2>&1 | grep -v -i warn | tee -a $OUT/dz_tiles.log
done
timeout 100 python3 benchmarks/train/step_profile.py problems/seeds/39_gemm_scale_batchnorm.py 2>&1 | grep -v -i warn | tee $OUT/step_profile.log | head -14
