#!/usr/bin/env bash
# The GPU check of `--backend cuda` (issue 22), on a GPU machine from the repository root:
#     benchmarks/cuda_backend/gpu_check.sh OUT        (OUT: an output folder; default out/cuda_backend)
# Under 8 minutes on an H100 even where every step runs to its `timeout` (180 + 80 + 45 + 25 + 130 s; a step cut
# short still leaves what it wrote); about 4 minutes when none does:
#   1. kfuse optimize --backend cuda on the seeds and four problems/gemm files, in parallel (each builds its
#      extension with nvcc: the builds dominate); the contract verdicts and ModelNew files go to OUT/cuda/;
#      beside them, the GPU tests of tests/test_cuda_backend.py that those builds do not cover (odd sizes and
#      both schemes, the CUDA-core kernels (ieee tile, GEMV) equal to their CPU models bit for bit, gradients, a
#      second process loading the built extension);
#   2. kfuse bench (eager baseline only, 2 contract draws) of the same problems with --backend cuda (built by
#      step 1: the first call is a load);
#   3. the GEMV kernel alone (benchmarks/cuda_backend/gemv_time.py: 1, 4, 16 rows x 8192 -> 8192 and an odd K,
#      against W's bandwidth floor and eager), then its GPU test (under 0.3 ms a call at batch 1), on an idle GPU;
#   4. kfuse bench --backend triton of the seeds and problem 37 only (1 contract draw: Triton's tuning made 7
#      problems run past the step's time on the first run);
#   5. a table: per problem the CUDA contract, ms of eager, cuda, triton, eager/cuda and cuda/triton.
# Needs nvcc and ninja on the machine (torch's load_inline); KFUSE_CACHE_DIR defaults to ./.kfuse-cache, as in
# benchmarks/gpu_run.sh, so Triton's autotune choices and the built extensions carry over between calls.
set -uo pipefail
out="${1:-out/cuda_backend}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="${KFUSE_CACHE_DIR:-$PWD/.kfuse-cache}"
mkdir -p "$out/cuda" "$KFUSE_CACHE_DIR"
problems=(problems/seeds/*.py problems/gemm/29_matmul_add_swish_tanh_gelu_hardtanh.py
          problems/gemm/35_mlp_linear_relu_linear.py problems/gemm/36_matmul_kn_param_tanh_scale.py
          problems/gemm/37_gemm_softplus_hardswish_batch1.py)
triton_problems=(problems/seeds/12_gemm_multiply_leakyrelu.py problems/gemm/37_gemm_softplus_hardswish_batch1.py
                 problems/seeds/62_matmul_groupnorm_leakyrelu_sum.py problems/seeds/39_gemm_scale_batchnorm.py)
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
    timeout 180 python3 -m kfuse optimize "$p" --backend cuda --trials 3 -o "$out/cuda/$n.py" \
        --json "$out/cuda/$n.json" > "$out/cuda/$n.log" 2>&1 &
done
TRITON_INTERPRET=0 timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_backend.py \
    -k "odd_sizes or bit_for_bit or gradients or second_process" > "$out/pytest-gpu.log" 2>&1 &
wait
echo "step 1: $((SECONDS - start)) s"
tail -3 "$out/pytest-gpu.log"
for p in "${problems[@]}"; do
    n="$(basename "$p" .py)"
    echo "-- $n: $(grep -E "^contract|^max abs|^left as|^eager|error|FAILED" "$out/cuda/$n.log" | tr '\n' ' ' | cut -c1-400)"
done

echo "== 2. kfuse bench --backend cuda (eager baseline) =="
start=$SECONDS
timeout 80 python3 -m kfuse bench "${problems[@]}" --baselines eager --trials 2 --backend cuda \
    --json "$out/bench-cuda.json" > "$out/bench-cuda.log" 2>&1
echo "bench cuda: exit $?, $((SECONDS - start)) s"

echo "== 3. the GEMV kernel (<= 16 rows) alone, then its GPU timing test =="
start=$SECONDS
timeout 45 python3 benchmarks/cuda_backend/gemv_time.py --json "$out/gemv-time.json" 2>&1
echo "gemv_time: exit $?, $((SECONDS - start)) s"
TRITON_INTERPRET=0 timeout 25 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_backend.py \
    -k gemv_reads_the_weight > "$out/pytest-gemv-time.log" 2>&1
echo "gemv timing test: exit $? ($(tail -1 "$out/pytest-gemv-time.log")), $((SECONDS - start)) s"

echo "== 4. kfuse bench --backend triton (the seeds and problem 37, eager baseline) =="
start=$SECONDS
timeout 130 python3 -m kfuse bench "${triton_problems[@]}" --baselines eager --trials 1 --backend triton \
    --json "$out/bench-triton.json" > "$out/bench-triton.log" 2>&1
echo "bench triton: exit $?, $((SECONDS - start)) s"

echo "== 5. summary =="
python3 benchmarks/cuda_backend/summarize.py "$out"
date
} 2>&1 | tee "$out/gpu_check.log"
