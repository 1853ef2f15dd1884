# session 13, call 2: the two changes side by side (benchmarks/gemm/family_variants.py), then kfuse bench on
# 41 and 43 again, then the GPU tests of the two-phase GroupNorm (full-size problems on the GPU)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
timeout 220 python3 benchmarks/gemm/family_variants.py --rounds 3 2>&1 | tee $OUT/family_variants.log | grep -v Warning
KFUSE_BENCH_TIMEOUT=260 bash benchmarks/gpu_run.sh gemm $OUT/b problems/gemm/41_gemm_softmax_dropout_eval.py \
    problems/gemm/43_gemm_groupnorm_narrow_tanh.py 2>&1 | tail -8
rm -f $OUT/b/cache/inductor.tgz
TRITON_INTERPRET=0 timeout 100 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_groupnorm_wide.py > $OUT/pytest-gpu-wide.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/pytest-gpu-wide.log | tail -8
