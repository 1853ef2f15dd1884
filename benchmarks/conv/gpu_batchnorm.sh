#!/usr/bin/env bash
# GPU check of BatchNorm after a convolution (regions/conv_batchnorm.py, kernels/conv_norm.py), from the repository
# root on an H100 / H200:
#   benchmarks/conv/gpu_batchnorm.sh [OUT]          (default OUT: benchmarks/conv/gpu-batchnorm)
# 1. `kfuse optimize --device cuda` on problems/conv 18 and 32-35 at their own (odd, small) sizes: the compiled
#    statistics, finalize and apply kernels (training mode, running statistics) and the eval fold (35) through the
#    accuracy contract, 90 s each;
# 2. `kfuse bench --baselines eager` at full size on KernelBench level 2 problems 73 (Conv2d + BatchNorm + scale),
#    52 (Conv2d + activation + BatchNorm, torch.multiply) and 15 (ConvTranspose3d + BatchNorm, then a torch mean),
#    90 s each. Under 8 minutes in all. The log's first lines name the GPU, the versions and the commit.
set -uo pipefail
out="${1:-benchmarks/conv/gpu-batchnorm}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$PWD/.kfuse-cache" TRITON_INTERPRET=0
mkdir -p "$out"
kb="${KB:-../shared/kernelbench}"
for d in shared/kernelbench kb; do [ -d "$kb" ] || kb=$d; done
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    git rev-parse HEAD 2>/dev/null || true

    echo "== 1. kfuse optimize --device cuda, problems/conv with BatchNorm"
    for f in problems/conv/18_*.py problems/conv/32_*.py problems/conv/33_*.py problems/conv/34_*.py \
             problems/conv/35_*.py; do
        n=$(basename "$f" .py)
        timeout 90 python3 -m kfuse optimize "$f" --device cuda -o "$out/${n}_new.py" --json "$out/$n.opt.json" \
            > "$out/$n.opt.log" 2>&1
        echo "$n: exit $? ($(grep -h 'max abs err' "$out/$n.opt.log" | head -1))"
    done

    echo "== 2. kfuse bench, full size"
    for f in level2/73_Conv2d_BatchNorm_Scaling.py level2/52_Conv2d_Activation_BatchNorm.py \
             level2/15_ConvTranspose3d_BatchNorm_Subtract.py; do
        n=$(basename "$f" .py)
        timeout 90 python3 -m kfuse bench "$kb/$f" --baselines eager --trials 3 --json "$out/$n.json" \
            || echo "$n: exit $? (124: over its 90 s)"
    done
    python3 - "$out" <<'PY'
import json, pathlib, sys
print(f"{'problem':60} {'correct':>7} {'kfuse ms':>9} {'eager ms':>9} {'eager/kfuse':>11}")
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    if p.name.endswith(".opt.json"):
        continue
    for r in json.loads(p.read_text()).get("results", []):
        k, e = r.get("kfuse_ms"), r.get("eager_ms")
        ratio = f"{e / k:.2f}x" if k and e else "-"
        print(f"{r['problem'][:60]:60} {str(r['correct']):>7} {k or '-':>9} {e or '-':>9} {ratio:>11}")
PY
} 2>&1 | tee "$out/batchnorm.log"
