#!/usr/bin/env bash
# The convolution tile in Gluon (kernels/conv_sm90.py) on an H100 / H200, from the repository root:
#   KB=kb benchmarks/conv/gpu_sm90.sh OUT [FILE...]
# its GPU tests (odd sizes against float64 and the Triton tile), then packed_bench.py with PACKED_CONFIGS=few on
# KernelBench files' first convolutions (the Triton tile's default and 128 x 128 x 64 against the Gluon tile's
# configs: conv_forward end to end and the tile kernel alone).
# SKIP_TESTS=1: the bench alone.
set -uo pipefail
out="${1:?output folder}"; shift
source "$(dirname "$0")/gpu_env.sh"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(level2/1_Conv2D_ReLU_BiasAdd.py level2/47_Conv3d_Mish_Tanh.py
    level2/57_Conv2d_ReLU_HardSwish.py level2/25_Conv2d_Min_Tanh_Tanh.py level2/43_Conv3d_Max_LogSumExp_ReLU.py)
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    echo "${COMMIT:-}"
    [ -n "${SKIP_TESTS:-}" ] || (cd tests && timeout 240 python3 -m pytest -p no:cacheprovider -q -x test_conv_sm90.py \
        2>&1 | tail -30)
    PACKED_CONFIGS=few timeout "${BENCH_S:-300}" python3 benchmarks/conv/packed_bench.py "$out/sm90.json" \
        "${files[@]/#/$kb/}"
    echo "packed_bench exit $?"
} 2>&1 | tee "$out/sm90.log"
