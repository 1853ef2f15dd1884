#!/usr/bin/env bash
# GPU check of reductions over a convolution's channels (regions/conv_channel_reduce.py, kernels/conv_reduce.py), from
# the repository root on an H100 / H200:
#   benchmarks/conv/gpu_channel_reduce.sh [OUT]          (default OUT: benchmarks/conv/gpu-channel-reduce)
# 1. `kfuse optimize --device cuda` on problems/conv 40-43 at their own (odd, small) sizes through the accuracy
#    contract, 45 s each: the two phases (partials, per-pixel finalize) where a pixel's channels span column tiles
#    (40: 136 channels = two 128-wide tiles; 42: three groups' tiles), the one-tile kernel (the reduction in the
#    convolution's epilogue) elsewhere (41: softmax + bias + sigmoid over 19 channels; 43: max and a float64 sum over
#    67);
# 2. `kfuse bench --baselines eager` at full size on KernelBench level 2 problems 25 (Conv2d + min over the channels
#    + tanh + tanh), 91 (ConvTranspose2d + softmax over 128 channels + bias + scale + sigmoid) and 58 (ConvTranspose3d
#    + logsumexp over 16 channels + per-pixel ops), 75 s each: all three one-tile (C_out <= 128, one group). Under 5 minutes as a rule (the
#    limits add up to 6.5). The log's first lines name the GPU, the versions and the commit.
set -uo pipefail
out="${1:-benchmarks/conv/gpu-channel-reduce}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$PWD/.kfuse-cache" TRITON_INTERPRET=0
mkdir -p "$out"
kb="${KB:-../shared/kernelbench}"
for d in shared/kernelbench kb; do [ -d "$kb" ] || kb=$d; done
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    git rev-parse HEAD 2>/dev/null || true

    echo "== 1. kfuse optimize --device cuda, problems/conv with a channel reduction"
    for f in problems/conv/40_*.py problems/conv/41_*.py problems/conv/42_*.py problems/conv/43_*.py; do
        n=$(basename "$f" .py)
        timeout 45 python3 -m kfuse optimize "$f" --device cuda -o "$out/${n}_new.py" --json "$out/$n.opt.json" \
            > "$out/$n.opt.log" 2>&1
        echo "$n: exit $? ($(grep -h 'max abs err' "$out/$n.opt.log" | head -1))"
    done

    echo "== 2. kfuse bench, full size"
    for f in level2/25_Conv2d_Min_Tanh_Tanh.py level2/91_ConvTranspose2d_Softmax_BiasAdd_Scaling_Sigmoid.py \
             level2/58_ConvTranspose3d_LogSumExp_HardSwish_Subtract_Clamp.py; do
        n=$(basename "$f" .py)
        timeout 75 python3 -m kfuse bench "$kb/$f" --baselines eager --trials 3 --json "$out/$n.json" \
            || echo "$n: exit $? (124: over its 75 s)"
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
} 2>&1 | tee "$out/channel_reduce.log"
