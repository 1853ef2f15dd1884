# session 15, call 5: tests/test_training_fast.py's GPU tests (training steps with the twins in the forward), then
# kfuse bench on the seeds again (does call 3's result repeat?)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 260 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_training_fast.py > $OUT/pytest-gpu-training-session15.log 2>&1
grep -E "FAILED|ERROR|passed|failed" $OUT/pytest-gpu-training-session15.log | tail -14
bash benchmarks/gpu_run.sh seeds $OUT
rm -rf $OUT/cache
