#!/usr/bin/env bash
# One short GPU call for depthwise convolutions on kernels/conv_depthwise.py's direct tile, from the repository root
# on an H100 / H200 (under 4 minutes in all):
#   benchmarks/conv/gpu_depthwise.sh OUT
# 1. `kfuse optimize --device cuda` on problems/conv 05 (depthwise Conv2d + hardswish) and 11 (depthwise Conv1d
#    'same', dilated even kernel, silu + residual), both at once, 60 s each: the compiled tile through the contract;
# 2. `kfuse bench --baselines eager,eager_strict --trials 2` at full size on KernelBench level 1 problem 82
#    (depthwise 3x3, 16 x 64 x 512 x 512; the GEMM tile ran it at 0.05x eager), 90 s;
# OUT gets gpu_depthwise.log (the summary) and depthwise.tgz (every log and JSON).
set -uo pipefail
out="${1:?output folder}"
work="$(mktemp -d)"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$work/cache" TRITON_INTERPRET=0
if { ! command -v bwrap || ! command -v prlimit; } >/dev/null 2>&1 && [ -x "$PWD/out/bwrap/bwrap" ]; then export PATH="$PATH:$PWD/out/bwrap"; fi
kb="${KB:-../shared/kernelbench}"
for d in shared/kernelbench kb ../kb; do [ -d "$kb" ] || kb=$d; done
mkdir -p "$out"
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    git rev-parse HEAD 2>/dev/null || cat COMMIT 2>/dev/null || true

    echo "== 1. kfuse optimize --device cuda, problems/conv 05 and 11"
    ls problems/conv/05_*.py problems/conv/11_*.py | xargs -P 2 -I{} sh -c '
        n="$(basename {} .py)"
        timeout 60 python3 -m kfuse optimize {} --device cuda -o "'"$work"'/${n}_new.py" --json "'"$work"'/$n.opt.json" \
            > "'"$work"'/$n.opt.log" 2>&1
        echo "$n: exit $? ($(grep -h "max abs err" "'"$work"'/$n.opt.log" | head -1))"'
    python3 - "$work" <<'PY'
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.opt.json")):
    r = json.loads(p.read_text())
    kinds = sorted({g.get("kind") for g in r.get("regions", []) if isinstance(g, dict)} - {None})
    print(f"{p.name[:-9]:55} correct={r.get('correct')} err={r.get('max_abs_err')} eager={r.get('ref_max_abs_err')} "
          f"unfused={r.get('unfused_ops')} fallback={r.get('fallback')} kinds={kinds}")
PY

    echo "== 2. kfuse bench, full size, level 1 problem 82"
    f=level1/82_conv_depthwise_2D_square_input_square_kernel.py
    n=$(basename "$f" .py)
    timeout 90 python3 -m kfuse bench "$kb/$f" --baselines eager,eager_strict --trials 2 \
        --json "$work/$n.bench.json" > "$work/$n.bench.log" 2>&1
    echo "$n: exit $?"
    python3 - "$work" <<'PY'
import json, pathlib, sys
keys = ("eager_ms", "eager_strict_ms", "kfuse_ms", "correct", "kernelbench_allclose", "max_abs_err",
        "ref_max_abs_err")
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.bench.json")):
    for r in json.loads(p.read_text()).get("results", []):
        print(r["problem"], {k: r.get(k) for k in keys}, r.get("errors", ""))
PY

} 2>&1 | tee "$out/gpu_depthwise.log"
tar czf "$out/depthwise.tgz" -C "$work" --exclude=cache .
