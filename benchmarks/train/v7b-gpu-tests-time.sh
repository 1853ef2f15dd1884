# v7b of train/NOTES.md (`x @ W` regions' dW from the forward's split too, TRANS_OUT store): the training path's GPU
# tests (gputests/training-kn-path-check.log), then the step time of 39 and 12 (train/step_time-v7b.log; the GEMM
# kernel's source changed, so its configs are tuned again). Ran at code 6bc399d on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 300 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_training_fast.py > $OUT/pytest-gpu.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/pytest-gpu.log | tail -14
timeout 150 python3 benchmarks/train/step_time.py problems/seeds/39_gemm_scale_batchnorm.py problems/seeds/12_gemm_multiply_leakyrelu.py 2>&1 | grep -v -i warn | tail -3 | tee $OUT/step_time.log
cp $KFUSE_CACHE_DIR/autotune.json $OUT/autotune.json
