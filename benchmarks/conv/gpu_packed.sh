#!/usr/bin/env bash
# The packed convolution tile on an H100 / H200, from the repository root:
#   KB=kb benchmarks/conv/gpu_packed.sh OUT [FILE...]
# packed_bench.py on KernelBench convolutions at full size (each config's time, the tile alone, the packing pass,
# cuDNN TF32 and strict fp32, errors against float64), then `kfuse bench` end to end on level 2 problem 67.
set -uo pipefail
out="${1:?output folder}"; shift
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 KFUSE_CACHE_DIR="$PWD/.kfuse-cache"
kb="${KB:-../shared/kernelbench}"
mkdir -p "$out"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(level2/1_Conv2D_ReLU_BiasAdd.py level2/67_Conv2d_GELU_GlobalAvgPool.py
    level1/67_conv_standard_1D.py level2/23_Conv3d_GroupNorm_Mean.py level1/87_conv_pointwise_2D.py)
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    cat COMMIT 2>/dev/null || git log -1 --format=%h
    timeout 420 python3 benchmarks/conv/packed_bench.py "$out/packed.json" "${files[@]/#/$kb/}"
    echo "packed_bench exit $?"
    timeout 150 python3 -m kfuse bench "$kb/level2/67_Conv2d_GELU_GlobalAvgPool.py" --baselines eager,eager_strict \
        --trials 2 --json "$out/l2-67-bench.json" > "$out/l2-67-bench.log" 2>&1
    echo "bench 67 exit $?"; tail -5 "$out/l2-67-bench.log"
} 2>&1 | tee "$out/packed.log"
