# session 12, call 3: dW from the forward's split of x (gemm_dw_presplit): GPU tests, then seed 39's step profile
# and step time (eager, then kfuse) for 39 and 12
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
TRITON_INTERPRET=0 timeout 240 python3 -m pytest -q -m gpu tests/test_training_fast.py tests/test_graphs.py -p no:cacheprovider 2>&1 | tail -6 | tee $OUT/pytest-gpu.log
timeout 120 python3 benchmarks/train/step_profile.py problems/seeds/39_gemm_scale_batchnorm.py 2>&1 | grep -v -i warn | tee $OUT/step_profile.log
timeout 90 python3 benchmarks/train/step_time.py problems/seeds/39_gemm_scale_batchnorm.py problems/seeds/12_gemm_multiply_leakyrelu.py 2>&1 | grep -v -i warn | tail -3 | tee $OUT/step_time.log
cp $KFUSE_CACHE_DIR/autotune.json $OUT/autotune.json
