# The persistent twin (a block per SM walks the tiles; its producer warp loads the next tile during the epilogue):
# GPU tests (log not kept, 9 passed), A/B against the one-tile twin on 39 and 12 (gemm/sm90/sm90_ab-v4.*), and 39's
# kernel profile (gemm/sm90/profile39-p.log). Ran at code f409907 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_sm90.py > $OUT/pytest-gpu-sm90p.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Error" $OUT/pytest-gpu-sm90p.log | tail -12
timeout 300 python3 benchmarks/gemm/sm90_ab.py problems/seeds/39_gemm_scale_batchnorm.py problems/seeds/12_gemm_multiply_leakyrelu.py --configs sm90_c4,sm90p_c4 --rounds 3 --json $OUT/sm90_ab-v4.json > $OUT/sm90_ab-v4.log 2>&1
cut -c1-400 $OUT/sm90_ab-v4.log
timeout 120 python3 benchmarks/gemm/sm90_profile.py problems/seeds/39_gemm_scale_batchnorm.py sm90_c4 sm90p_c4 > $OUT/profile39-p.log 2>&1
grep -E "==|time_cuda|stats_kernel" $OUT/profile39-p.log | cut -c1-180
