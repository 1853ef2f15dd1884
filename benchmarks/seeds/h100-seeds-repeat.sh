# Problem 37 tuned by the interleaved and the sequential tuner (skinny/tuner_ab37.log), tests/test_training_fast.py's
# GPU tests (gputests/training-early-wait.log), then kfuse bench on the seeds again (seeds/h100-seeds-repeat.json):
# does seeds/h100-seeds.json repeat at the same code? Ran at code eb62626 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
timeout 100 python3 benchmarks/skinny/tuner_ab.py > $OUT/tuner_ab37.log 2>&1; cut -c1-600 $OUT/tuner_ab37.log | tail -20
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_training_fast.py > $OUT/pytest-gpu.log 2>&1
grep -E "FAILED|ERROR|passed|failed" $OUT/pytest-gpu.log | tail -14
bash benchmarks/gpu_run.sh seeds $OUT
rm -rf $OUT/cache
