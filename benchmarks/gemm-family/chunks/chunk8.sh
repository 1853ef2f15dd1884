# The two changes of chunk 8 side by side (benchmarks/gemm/family_variants.py: gemm/family_variants-v1.log), kfuse
# bench on 41 and 43 (gemm-family/chunks/chunk8.json, .log), then the two-phase GroupNorm's GPU tests (log not kept;
# gputests/groupnorm-wide-narrow-groups.log reran them at the next commit). Ran at code 0b2a32c on an H100, OUT its
# output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
timeout 220 python3 benchmarks/gemm/family_variants.py --rounds 3 2>&1 | tee $OUT/family_variants.log | grep -v Warning
KFUSE_BENCH_TIMEOUT=260 bash benchmarks/gpu_run.sh gemm $OUT/b problems/gemm/41_gemm_softmax_dropout_eval.py \
    problems/gemm/43_gemm_groupnorm_narrow_tanh.py 2>&1 | tail -8
rm -f $OUT/b/cache/inductor.tgz
TRITON_INTERPRET=0 timeout 100 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_groupnorm_wide.py > $OUT/pytest-gpu-wide.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/pytest-gpu-wide.log | tail -8
