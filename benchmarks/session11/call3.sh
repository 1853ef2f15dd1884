export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
for p in 39_gemm_scale_batchnorm 62_matmul_groupnorm_leakyrelu_sum 12_gemm_multiply_leakyrelu; do
  timeout 150 python3 benchmarks/train/dz_tiles.py problems/seeds/$p.py 2>&1 | grep -v -i warn | tee -a $OUT/dz_tiles.log
done
timeout 100 python3 benchmarks/train/step_profile.py problems/seeds/39_gemm_scale_batchnorm.py 2>&1 | grep -v -i warn | tee $OUT/step_profile.log | head -14
timeout 120 python3 benchmarks/gemm/concat_k.py --set 2 > $OUT/concat_k2.log 2>&1; tail -12 $OUT/concat_k2.log
