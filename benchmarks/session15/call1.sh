# session 15, call 1: the tail split (the last wave's tiles cut along K) and the early promotion wait, on the GPU:
# GPU tests of the twins (tail tests included), then A/B on 39 and 12 (contract + time_cuda, 3 rounds alternating),
# then 39's kernel times under torch.profiler
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
TRITON_INTERPRET=0 timeout 220 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_sm90.py > $OUT/pytest-gpu-sm90-tail.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Error" $OUT/pytest-gpu-sm90-tail.log | tail -16
timeout 270 python3 benchmarks/gemm/sm90_ab.py problems/seeds/39_gemm_scale_batchnorm.py --configs sm90p_c4_notail,sm90p_c4,sm90p_c4e --rounds 3 --json $OUT/sm90_ab-v5.json > $OUT/sm90_ab-v5.log 2>&1
cut -c1-400 $OUT/sm90_ab-v5.log
timeout 90 python3 benchmarks/gemm/sm90_profile.py problems/seeds/39_gemm_scale_batchnorm.py sm90p_c4_notail sm90p_c4 sm90p_c4e > $OUT/profile39-tail.log 2>&1
grep -E "==|time_cuda|_kernel|nvidia-smi" $OUT/profile39-tail.log | cut -c1-200
