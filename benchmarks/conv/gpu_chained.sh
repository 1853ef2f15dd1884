#!/usr/bin/env bash
# The A/B of fp16x3p's K loop (kernels/conv.py CHAINED), on a GPU machine from the repository root:
#     KB=kb benchmarks/conv/gpu_chained.sh OUT [micro] [bench]
#   micro  chained_bench.py (the convolution alone, default tile and the tuner's candidates) on MICRO's files,
#          chained then not (KFUSE_CONV_CHAINED=1, 0): one process each, the switch is read at import
#   bench  kfuse bench --baselines eager --trials 1 of BENCH's KernelBench level 2 files, not chained then chained
# MICRO / BENCH: paths relative to the KernelBench folder.
set -uo pipefail
out="${1:-out/chained}"
shift || true
source "$(dirname "$0")/gpu_env.sh"
micro=(${MICRO:-level2/1_Conv2D_ReLU_BiasAdd.py level1/67_conv_standard_1D.py level1/87_conv_pointwise_2D.py
       level2/67_Conv2d_GELU_GlobalAvgPool.py level2/17_Conv2d_InstanceNorm_Divide.py
       level2/2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide.py level2/100_ConvTranspose3d_Clamp_Min_Divide.py})
bench=(${BENCH:-level2/1_Conv2D_ReLU_BiasAdd.py level2/17_Conv2d_InstanceNorm_Divide.py
       level2/2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide.py})
{
date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for step in "$@"; do
    start=$SECONDS
    echo "== $step =="
    case "$step" in
    micro)
        for c in 1 0; do
            KFUSE_CONV_CHAINED=$c timeout 170 python3 benchmarks/conv/chained_bench.py "$out/micro-$c.json" \
                "${micro[@]/#/$kb/}" > "$out/micro-$c.log" 2>&1
            echo "micro chained=$c: exit $?"; cat "$out/micro-$c.log"
        done;;
    bench)
        for c in 0 1; do
            KFUSE_CONV_CHAINED=$c timeout 110 python3 -m kfuse bench "${bench[@]/#/$kb/}" --baselines eager --trials 1 \
                --json "$out/bench-$c.json" > "$out/bench-$c.log" 2>&1
            echo "bench chained=$c: exit $?"
            python3 -c "import json,sys; [print(r['problem'][:40], round(r['eager_ms'] or 0, 3), round(r['kfuse_ms'] or 0, 3),
 r['correct'], r.get('max_abs_err'), r.get('ref_max_abs_err')) for r in json.load(open(sys.argv[1]))['results']]" \
                "$out/bench-$c.json"
        done;;
    *) echo "unknown step $step";;
    esac
    echo "$step: $((SECONDS - start)) s"
done
date
} 2>&1 | tee -a "$out/chained.log"
