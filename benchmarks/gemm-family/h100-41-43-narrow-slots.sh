# GPU tests of graphs, wide GroupNorm and the GEMM core (log not kept), then kfuse bench on problem 41 (Dropout in
# eval mode fused away) and problem 43 (GroupNorm, 910 groups of 9 channels) with partial slots for narrow groups
# (gemm-family/h100-41-43-narrow-slots.json, .log). Ran at code edf509c on an H100, OUT its output folder.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR=$PWD/.kfuse-cache
bash benchmarks/gpu_run.sh gputests $OUT/t tests/test_graphs.py tests/test_groupnorm_wide.py tests/test_gemm_core.py 2>&1 | tail -8
KFUSE_BENCH_TIMEOUT=420 bash benchmarks/gpu_run.sh gemm $OUT/b problems/gemm/41_gemm_softmax_dropout_eval.py \
    problems/gemm/43_gemm_groupnorm_narrow_tanh.py 2>&1 | tail -20
rm -f $OUT/b/cache/inductor.tgz $OUT/t/cache/inductor.tgz
