# Every GPU test (log not kept: 35 passed before the run's time limit), then where problem 39's bench loop leaves the
# GPU idle: torch.profiler over 10 calls, each after the 256 MB L2 flush the bench writes (gemm/sm90/gaps39.log).
# Ran at code 54d1317 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 420 python3 -m pytest -v -p no:cacheprovider -m gpu tests > $OUT/pytest-gpu.log 2>&1
grep -E "FAILED|ERROR|passed|failed" $OUT/pytest-gpu.log | tail -14
GAPS=1 timeout 100 python3 benchmarks/gemm/sm90_profile.py problems/seeds/39_gemm_scale_batchnorm.py sm90p_c4 > $OUT/gaps39.log 2>&1
grep -E "==|time_cuda|idle" $OUT/gaps39.log | cut -c1-900
