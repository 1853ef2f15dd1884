# The tail split (the last wave's tiles cut along K) and the early promotion wait on the GPU: the twins' GPU tests
# (gputests/sm90-tail-split.log), A/B on 39 with configs one after another (gemm/sm90/sm90_ab-v5.*), then 39's kernel
# times under torch.profiler (gemm/sm90/profile39-tail.log). Ran at code ddaa120 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
TRITON_INTERPRET=0 timeout 220 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_sm90.py > $OUT/pytest-gpu-sm90-tail.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Error" $OUT/pytest-gpu-sm90-tail.log | tail -16
timeout 270 python3 benchmarks/gemm/sm90_ab.py problems/seeds/39_gemm_scale_batchnorm.py --configs sm90p_c4_notail,sm90p_c4,sm90p_c4e --rounds 3 --json $OUT/sm90_ab-v5.json > $OUT/sm90_ab-v5.log 2>&1
cut -c1-400 $OUT/sm90_ab-v5.log
timeout 90 python3 benchmarks/gemm/sm90_profile.py problems/seeds/39_gemm_scale_batchnorm.py sm90p_c4_notail sm90p_c4 sm90p_c4e > $OUT/profile39-tail.log 2>&1
grep -E "==|time_cuda|_kernel|nvidia-smi" $OUT/profile39-tail.log | cut -c1-200
