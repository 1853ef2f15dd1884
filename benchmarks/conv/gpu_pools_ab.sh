#!/usr/bin/env bash
# The A/B of the two opt-in pool paths, on a GPU machine from the repository root:
#     KB=kb benchmarks/conv/gpu_pools_ab.sh OUT
# 1. `--backend cuda`'s pool after a convolution (kfuse/cuda/conv_pools.py, KFUSE_CUDA_CONV_POOLS): the GPU tests of
#    tests/test_cuda_conv_pools.py with the switch on, then kfuse bench of CUDAPOOL (KernelBench level 2 numbers,
#    default 35 67) with the switch on (the kind) and off (the convolution's region, then torch's pool).
# 2. Triton's windowed pool after a transposed convolution (regions/conv_pool.py, KFUSE_TRANSPOSED_POOLS): kfuse bench
#    of TPOOL (default 50 74 89) with the switch on and off.
# Each bench verifies the accuracy contract at full size (one draw set: --trials 1) and times eager beside kfuse.
set -uo pipefail
out="${1:-out/pools_ab}"
source "$(dirname "$0")/gpu_env.sh"
export CUTLASS_PATH="${CUTLASS_PATH:-$PWD/.cutlass}"
files() { for n in $1; do ls "$kb/level2/${n}_"*.py; done; }
bench() {  # name, switch variable, value, backend, files...
    local name=$1 var=$2 val=$3 backend=$4; shift 4
    env "$var=$val" timeout 200 python3 -m kfuse bench "$@" --baselines eager --trials 1 --backend "$backend" \
        --json "$out/$name-$val.json" > "$out/$name-$val.log" 2>&1
    echo "$name $var=$val: exit $?"; tail -$(($# + 2)) "$out/$name-$val.log"
}
{
date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
KFUSE_CUDA_CONV_POOLS=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_conv_pools.py \
    > "$out/pytest-cuda-conv-pools.log" 2>&1; echo "pytest: exit $?"; tail -3 "$out/pytest-cuda-conv-pools.log"
mapfile -t cuda_files < <(files "${CUDAPOOL:-35 67}")
mapfile -t t_files < <(files "${TPOOL:-50 74 89}")
bench tpool KFUSE_TRANSPOSED_POOLS 1 triton "${t_files[@]}"
bench tpool KFUSE_TRANSPOSED_POOLS 0 triton "${t_files[@]}"
bench cudapool KFUSE_CUDA_CONV_POOLS 1 cuda "${cuda_files[@]}"
bench cudapool KFUSE_CUDA_CONV_POOLS 0 cuda "${cuda_files[@]}"
date
} 2>&1 | tee -a "$out/pools_ab.log"
