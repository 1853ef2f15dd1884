# session 15, call 5: problem 37 (whose GPU test failed in call 4: kfuse 0.144 ms against eager's 0.131) tuned by the
# interleaved and the old sequential tuner (benchmarks/skinny/tuner_ab.py); tests/test_training_fast.py's GPU tests
# (training steps with the twins in the forward); then kfuse bench on the seeds again (does call 3's result repeat?)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
timeout 100 python3 benchmarks/skinny/tuner_ab.py > $OUT/tuner_ab37.log 2>&1; cut -c1-600 $OUT/tuner_ab37.log | tail -20
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_training_fast.py > $OUT/pytest-gpu-training-session15.log 2>&1
grep -E "FAILED|ERROR|passed|failed" $OUT/pytest-gpu-training-session15.log | tail -14
bash benchmarks/gpu_run.sh seeds $OUT
rm -rf $OUT/cache
