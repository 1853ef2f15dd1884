#!/usr/bin/env bash
# The first GPU check of `--backend cuda` (issue 22), on a GPU machine from the repository root:
#     benchmarks/cuda_backend/gpu_check.sh OUT        (OUT: an output folder; default out/cuda_backend)
# Under 8 minutes on an H100 (every step under `timeout`, so a step cut short still leaves what it wrote):
#   1. kfuse optimize --backend cuda on the seeds and four problems/gemm files, in parallel (each builds its
#      extension with nvcc: the builds dominate); the contract verdicts and ModelNew files go to OUT/cuda/;
#      beside them, the GPU tests of tests/test_cuda_backend.py that those builds do not cover (odd sizes and
#      both schemes, gradients, a second process loading the built extension);
#   2. kfuse bench (eager baseline only, 2 contract draws) of the same problems with --backend cuda (built by
#      step 1: the first call is a load) and then --backend triton, one after the other;
#   3. a table: per problem the CUDA contract, ms of eager, cuda, triton, eager/cuda and cuda/triton.
# Needs nvcc and ninja on the machine (torch's load_inline); KFUSE_CACHE_DIR defaults to ./.kfuse-cache, as in
# benchmarks/gpu_run.sh, so Triton's autotune choices and the built extensions carry over between calls.
set -uo pipefail
out="${1:-out/cuda_backend}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="${KFUSE_CACHE_DIR:-$PWD/.kfuse-cache}"
mkdir -p "$out/cuda" "$KFUSE_CACHE_DIR"
problems=(problems/seeds/*.py problems/gemm/29_matmul_add_swish_tanh_gelu_hardtanh.py
          problems/gemm/35_mlp_linear_relu_linear.py problems/gemm/36_matmul_kn_param_tanh_scale.py
          problems/gemm/37_gemm_softplus_hardswish_batch1.py)
{
date
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
echo "nvcc: $(command -v nvcc || echo MISSING) ($(nvcc --version 2>/dev/null | tail -1)); ninja: $(command -v ninja || echo MISSING)"
if ! python3 -c "from torch.utils.cpp_extension import is_ninja_available as ok, CUDA_HOME; raise SystemExit(not (ok() and CUDA_HOME))"; then
    echo "gpu_check: torch's load_inline needs ninja and the CUDA toolkit (nvcc, CUDA_HOME) on this machine; stopping"
    exit 2
fi

echo "== 1. kfuse optimize --backend cuda (parallel builds), GPU tests =="
start=$SECONDS
for p in "${problems[@]}"; do
    n="$(basename "$p" .py)"
    timeout 240 python3 -m kfuse optimize "$p" --backend cuda --trials 3 -o "$out/cuda/$n.py" \
        --json "$out/cuda/$n.json" > "$out/cuda/$n.log" 2>&1 &
done
TRITON_INTERPRET=0 timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_backend.py \
    -k "odd_sizes or gradients or second_process" > "$out/pytest-gpu.log" 2>&1 &
wait
echo "step 1: $((SECONDS - start)) s"
tail -3 "$out/pytest-gpu.log"
for p in "${problems[@]}"; do
    n="$(basename "$p" .py)"
    echo "-- $n: $(grep -E "^contract|^max abs|^left as|^eager|error|FAILED" "$out/cuda/$n.log" | tr '\n' ' ' | cut -c1-400)"
done

echo "== 2. kfuse bench --backend cuda, then --backend triton (eager baseline) =="
start=$SECONDS
timeout 100 python3 -m kfuse bench "${problems[@]}" --baselines eager --trials 2 --backend cuda \
    --json "$out/bench-cuda.json" > "$out/bench-cuda.log" 2>&1
echo "bench cuda: exit $?, $((SECONDS - start)) s"
start=$SECONDS
timeout 130 python3 -m kfuse bench "${problems[@]}" --baselines eager --trials 2 --backend triton \
    --json "$out/bench-triton.json" > "$out/bench-triton.log" 2>&1
echo "bench triton: exit $?, $((SECONDS - start)) s"

echo "== 3. summary =="
python3 benchmarks/cuda_backend/summarize.py "$out"
date
} 2>&1 | tee "$out/gpu_check.log"
