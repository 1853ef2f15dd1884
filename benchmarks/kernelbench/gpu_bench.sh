#!/usr/bin/env bash
# On the GPU machine, from the repository root: `kfuse bench` on KernelBench files at full size, results under OUT.
#   benchmarks/kernelbench/gpu_bench.sh OUT NAME BASELINES FILE...
# writes OUT/NAME.json, OUT/NAME.png and OUT/NAME.log (BASELINES: --baselines value, e.g. eager).
set -uo pipefail
out="${1:?output folder}"; name="${2:?name}"; baselines="${3:?baselines}"; shift 3
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$PWD/.kfuse-cache"
export TORCHINDUCTOR_CACHE_DIR="$PWD/.kfuse-cache/inductor"
mkdir -p "$out" "$TORCHINDUCTOR_CACHE_DIR"
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    git rev-parse HEAD 2>/dev/null || true
    python3 -m kfuse bench "$@" --baselines "$baselines" --json "$out/$name.json" --plot "$out/$name.png"
} 2>&1 | tee "$out/$name.log"
