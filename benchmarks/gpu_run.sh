#!/usr/bin/env bash
# On the GPU machine, from the repository root: one phase of a GPU measurement, results under OUT.
#   benchmarks/gpu_run.sh check OUT          GPU tests; seeds: optimize, then `kfuse eval` of the output
#   benchmarks/gpu_run.sh seeds OUT          kfuse bench on the seeds
#   benchmarks/gpu_run.sh train OUT          kfuse bench --train on the seeds (training step)
#   benchmarks/gpu_run.sh gemm OUT FILE...   kfuse bench on the given problems/gemm files
#   benchmarks/gpu_run.sh gputests OUT FILE...  the GPU tests of the given test files only
#   benchmarks/gpu_run.sh profile OUT FILE...   benchmarks/overhead/profile_calls.py on each problem (per-call overhead)
# Every step runs under `timeout`, so a phase cut short still returns what it wrote.
set -uo pipefail
phase="${1:?phase}"; out="${2:?output folder}"; shift 2
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$PWD/.kfuse-cache"
# torch.compile's caches (compiled graphs, max-autotune choices) travel with .kfuse-cache too: a problem
# measured again in a later call then skips max-autotune's 30-70 s of tuning (its compile_s says so)
export TORCHINDUCTOR_CACHE_DIR="$PWD/.kfuse-cache/inductor"
mkdir -p "$out" "$TORCHINDUCTOR_CACHE_DIR"
log="$out/$phase.log"
mkdir -p .kfuse-cache/bin  # a `kfuse` command for `timeout` (a shell function would not do)
printf '#!/bin/sh\nexec python3 -m kfuse "$@"\n' > .kfuse-cache/bin/kfuse
chmod +x .kfuse-cache/bin/kfuse
export PATH="$PWD/.kfuse-cache/bin:$PATH"
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
case "$phase" in
check)
    # compiled kernels: conftest.py only defaults TRITON_INTERPRET to 1
    TRITON_INTERPRET=0 timeout 300 python3 -m pytest -v -p no:cacheprovider -m gpu tests > "$out/pytest-gpu.log" 2>&1
    grep -E "PASSED|FAILED|ERROR|passed|failed" "$out/pytest-gpu.log" | tail -20
    mkdir -p "$out/new"
    for p in problems/seeds/*.py; do
        n="$(basename "$p" .py)"
        timeout 120 kfuse optimize "$p" --device cuda -o "$out/new/${n}.py" --json "$out/new/${n}_optimize.json" 2>&1 | tail -3
        timeout 240 kfuse eval "$p" "$out/new/${n}.py" --device cuda --seed 11 --json "$out/new/${n}_eval.json" 2>&1 | tail -12
    done
    (cd "$out" && tar czf new.tar.gz new && rm -rf new)
    ;;
gputests)
    TRITON_INTERPRET=0 timeout 240 python3 -m pytest -v -p no:cacheprovider -m gpu "$@" > "$out/pytest-gpu.log" 2>&1
    grep -E "PASSED|FAILED|ERROR|passed|failed" "$out/pytest-gpu.log" | tail -20
    ;;
seeds)
    timeout 570 kfuse bench problems/seeds/*.py --json "$out/h100-seeds.json" --plot "$out/h100-seeds.png" 2>&1 | tail -12
    ;;
train)
    timeout "${KFUSE_BENCH_TIMEOUT:-560}" kfuse bench --train problems/seeds/*.py --json "$out/h100-train.json" --plot "$out/h100-train.png" 2>&1 | tail -14
    ;;
gemm)
    timeout "${KFUSE_BENCH_TIMEOUT:-570}" kfuse bench "$@" --json "$out/h100-gemm.json" --plot "$out/h100-gemm.png" \
        > "$out/gemm-full.log" 2>&1  # with each step's time stamp
    grep -v "^\[" "$out/gemm-full.log" | tail -60
    ;;
profile)
    for p in "$@"; do timeout 120 python3 benchmarks/overhead/profile_calls.py "$p"; done
    ;;
esac
# the autotune choices, so that a later call (carry .kfuse-cache) does not tune again
mkdir -p "$out/cache" && cp .kfuse-cache/*.json "$out/cache/" 2>/dev/null
tar czf "$out/cache/inductor.tgz" -C .kfuse-cache inductor 2>/dev/null
ls -la "$out/cache"
} 2>&1 | tee "$log"
