#!/usr/bin/env bash
# GPU check of pools after a convolution (regions/conv_pool.py, kernels/pooling.py), from the repository root on an
# H100 / H200:
#   benchmarks/conv/gpu_pool.sh [OUT]          (default OUT: benchmarks/conv/gpu-pool)
# 1. tests/test_conv_pool.py's GPU cases (compiled windowed kernels, max and avg, and the two-phase mean against
#    float64 with the contract's bound), 30 s;
# 2. `kfuse optimize --device cuda` on problems/conv 44-47 at their own (odd, small) sizes: MaxPool2d overlapping and
#    padded, AvgPool3d, a global mean, a batch-1 AvgPool1d in ceil mode, through the accuracy contract, 40 s each;
# 3. `kfuse bench --baselines eager` at full size on KernelBench level 2 problems 35 (Conv2d + ops + MaxPool2d + Mish),
#    67 (Conv2d + GELU + global average pool) and 46 (Conv2d + ops + AvgPool2d), 45 s each.
# About 5 minutes at most (every step at its limit). The log's first lines name the GPU, the versions and the commit.
set -uo pipefail
out="${1:-benchmarks/conv/gpu-pool}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$PWD/.kfuse-cache" TRITON_INTERPRET=0
mkdir -p "$out"
kb="${KB:-../shared/kernelbench}"
for d in shared/kernelbench kb; do [ -d "$kb" ] || kb=$d; done
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    git rev-parse HEAD 2>/dev/null || true

    echo "== 1. compiled kernels against float64"
    timeout 30 python3 -m pytest -p no:cacheprovider -q tests/test_conv_pool.py -k gpu 2>&1 | tail -5

    echo "== 2. kfuse optimize --device cuda, problems/conv with a pool"
    for f in problems/conv/44_*.py problems/conv/45_*.py problems/conv/46_*.py problems/conv/47_*.py; do
        n=$(basename "$f" .py)
        timeout 40 python3 -m kfuse optimize "$f" --device cuda -o "$out/${n}_new.py" --json "$out/$n.opt.json" \
            > "$out/$n.opt.log" 2>&1
        echo "$n: exit $? ($(grep -h 'max abs err' "$out/$n.opt.log" | head -1))"
    done

    echo "== 3. kfuse bench, full size"
    for f in level2/35_Conv2d_Subtract_HardSwish_MaxPool_Mish.py level2/67_Conv2d_GELU_GlobalAvgPool.py \
             level2/46_Conv2d_Subtract_Tanh_Subtract_AvgPool.py; do
        n=$(basename "$f" .py)
        timeout 45 python3 -m kfuse bench "$kb/$f" --baselines eager --trials 3 --json "$out/$n.json" \
            || echo "$n: exit $? (124: over its 45 s)"
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
} 2>&1 | tee "$out/pool.log"
