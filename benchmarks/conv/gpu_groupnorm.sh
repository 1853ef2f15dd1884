#!/usr/bin/env bash
# GPU check of GroupNorm and InstanceNorm after a convolution (regions/conv_groupnorm.py, kernels/conv_norm.py's
# conv_gn_*), from the repository root on an H100 / H200:
#   benchmarks/conv/gpu_groupnorm.sh [OUT]          (default OUT: benchmarks/conv/gpu-groupnorm)
# 1. `kfuse optimize --device cuda` on problems/conv 36-39 at their own (odd, small) sizes: the compiled stats kernel
#    (partials segmented by sample in 64-row tiles, stride phases in 38), the float64 finalize and the apply pass
#    through the accuracy contract, 40 s each;
# 2. `kfuse bench --baselines eager` at full size on KernelBench level 2 problems 17 (Conv2d + InstanceNorm2d +
#    divide), 61 (ConvTranspose3d + ReLU + GroupNorm, 16 channels a group) and 21 (Conv2d + add, scale, sigmoid +
#    GroupNorm), 50 s each. Under 5 minutes in all. The log's first lines name the GPU, the versions and the commit.
set -uo pipefail
out="${1:-benchmarks/conv/gpu-groupnorm}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$PWD/.kfuse-cache" TRITON_INTERPRET=0
mkdir -p "$out"
kb="${KB:-../shared/kernelbench}"
for d in shared/kernelbench kb; do [ -d "$kb" ] || kb=$d; done
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    git rev-parse HEAD 2>/dev/null || true

    echo "== 1. kfuse optimize --device cuda, problems/conv with GroupNorm / InstanceNorm"
    for f in problems/conv/36_*.py problems/conv/37_*.py problems/conv/38_*.py problems/conv/39_*.py; do
        n=$(basename "$f" .py)
        timeout 40 python3 -m kfuse optimize "$f" --device cuda -o "$out/${n}_new.py" --json "$out/$n.opt.json" \
            > "$out/$n.opt.log" 2>&1
        echo "$n: exit $? ($(grep -h 'max abs err' "$out/$n.opt.log" | head -1))"
    done

    echo "== 2. kfuse bench, full size"
    for f in level2/17_Conv2d_InstanceNorm_Divide.py level2/61_ConvTranspose3d_ReLU_GroupNorm.py \
             level2/21_Conv2d_Add_Scale_Sigmoid_GroupNorm.py; do
        n=$(basename "$f" .py)
        timeout 50 python3 -m kfuse bench "$kb/$f" --baselines eager --trials 3 --json "$out/$n.json" \
            || echo "$n: exit $? (124: over its 50 s)"
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
} 2>&1 | tee "$out/groupnorm.log"
