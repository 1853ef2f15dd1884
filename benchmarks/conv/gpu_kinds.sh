#!/usr/bin/env bash
# One GPU call for the convolution kinds that take over a conv walk (GroupNorm/InstanceNorm, channel reductions,
# pools), from the repository root on an H100 / H200:
#   benchmarks/conv/gpu_kinds.sh OUT
# 1. `kfuse optimize --device cuda` on problems/conv 01 (a plain conv: the tuner) and 36-47 (their own odd, small
#    sizes), four at a time, 100 s each: the compiled kernels through the accuracy contract;
# 2. `kfuse bench --baselines eager,eager_strict` at full size on KernelBench level 2 problems 17 (Conv2d +
#    InstanceNorm + divide), 67 (Conv2d + GELU + global average pool) and 25 (Conv2d + channel min + tanh x2), one
#    at a time, 90 s each;
# OUT gets gpu_kinds.log (the summary) and kinds.tgz (every log and JSON).
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

    echo "== 1. kfuse optimize --device cuda, problems/conv 36-47"
    ls problems/conv/01_*.py problems/conv/3[6-9]_*.py problems/conv/4[0-7]_*.py | xargs -P 4 -I{} sh -c '
        n="$(basename {} .py)"
        timeout 100 python3 -m kfuse optimize {} --device cuda -o "'"$work"'/${n}_new.py" --json "'"$work"'/$n.opt.json" \
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

    echo "== 2. kfuse bench, full size"
    for f in level2/17_Conv2d_InstanceNorm_Divide.py level2/67_Conv2d_GELU_GlobalAvgPool.py \
             level2/25_Conv2d_Min_Tanh_Tanh.py; do
        n=$(basename "$f" .py)
        timeout 90 python3 -m kfuse bench "$kb/$f" --baselines eager,eager_strict --trials 2 \
            --json "$work/$n.bench.json" > "$work/$n.bench.log" 2>&1
        echo "$n: exit $?"
    done
    python3 - "$work" <<'PY'
import json, pathlib, sys
keys = ("eager_ms", "eager_strict_ms", "compile_default_ms", "kfuse_ms", "correct", "kernelbench_allclose",
        "max_abs_err", "ref_max_abs_err")
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.bench.json")):
    for r in json.loads(p.read_text()).get("results", []):
        print(r["problem"], {k: r.get(k) for k in keys}, r.get("errors", ""))
PY

} 2>&1 | tee "$out/gpu_kinds.log"
tar czf "$out/kinds.tgz" -C "$work" --exclude=cache .
