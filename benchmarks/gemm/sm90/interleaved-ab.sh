# Interleaved A/B (configs taking turns call by call: benchmarks/gemm/ab_interleaved.py) of the tail split and the
# early promotion wait on 39, 12 and 62 (gemm/sm90/interleaved-ab-{39,12,62}.json); then kfuse bench on the seeds
# (seeds/h100-seeds-sequential-tuner.json: tail split on, early wait off). Ran at code ddaa120 (its configs
# sm90p_c4_notail, sm90p_c4e and sm90_c4e exist there) on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
timeout 100 python3 benchmarks/gemm/ab_interleaved.py problems/seeds/39_gemm_scale_batchnorm.py --configs sm90p_c4_notail,sm90p_c4,sm90p_c4e --rounds 150 --json $OUT/ab39.json
timeout 60 python3 benchmarks/gemm/ab_interleaved.py problems/seeds/12_gemm_multiply_leakyrelu.py --configs sm90p_c4,sm90p_c4e --rounds 200 --json $OUT/ab12.json
timeout 60 python3 benchmarks/gemm/ab_interleaved.py problems/seeds/62_matmul_groupnorm_leakyrelu_sum.py --configs sm90_c4,sm90_c4e --rounds 200 --json $OUT/ab62.json
bash benchmarks/gpu_run.sh seeds $OUT
rm -rf $OUT/cache
