# The Hopper twin's GPU tests (log not kept, 7 passed), then where the host's time per call of problem 39's forward
# goes with the twin: cProfile, benchmarks/gemm/sm90_profile.py with HOST_PROFILE=1 (gemm/sm90/host39.log). Ran at
# code 6068135 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 300 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_sm90.py > $OUT/pytest-gpu-sm90.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Error" $OUT/pytest-gpu-sm90.log | tail -14
HOST_PROFILE=1 timeout 150 python3 benchmarks/gemm/sm90_profile.py problems/seeds/39_gemm_scale_batchnorm.py sm90_c4 > $OUT/host39.log 2>&1
grep -A 30 "time_cuda" $OUT/host39.log | cut -c1-150
