# v7 of train/NOTES.md (dW from the forward's split of x, gemm_dw_presplit): the training path's GPU tests
# (gputests/training-dw-presplit.log), seed 39's step profile (train/step_profile-v7.log), and the step time,
# eager then kfuse, of 39 and 12 (train/step_time-v7.log). Ran at code 430e5e0 on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 240 python3 -m pytest -q -m gpu tests/test_training_fast.py tests/test_graphs.py -p no:cacheprovider 2>&1 | tail -6 | tee $OUT/pytest-gpu.log
timeout 120 python3 benchmarks/train/step_profile.py problems/seeds/39_gemm_scale_batchnorm.py 2>&1 | grep -v -i warn | tee $OUT/step_profile.log
timeout 90 python3 benchmarks/train/step_time.py problems/seeds/39_gemm_scale_batchnorm.py problems/seeds/12_gemm_multiply_leakyrelu.py 2>&1 | grep -v -i warn | tail -3 | tee $OUT/step_time.log
cp $KFUSE_CACHE_DIR/autotune.json $OUT/autotune.json
