#!/usr/bin/env bash
# A --backend cuda file judged by kfuse eval on an H100 / H200 (issue 22, item 4): seed 12 optimized with
# `--backend cuda` at batch 64, then `kfuse eval` of that file against the seed (sandboxed where bubblewrap runs:
# the load_inline extension is built in the candidate's compile cache; its kernels counted from profiler records).
#   benchmarks/cuda_backend/gpu_eval.sh OUT
set -uo pipefail
out="${1:?output folder}"
work="$(mktemp -d)"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$work/cache" TRITON_INTERPRET=0
if { ! command -v bwrap || ! command -v prlimit; } >/dev/null 2>&1 && [ -x "$PWD/out/bwrap/bwrap" ]; then export PATH="$PATH:$PWD/out/bwrap"; fi
mkdir -p "$out"
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    seed=problems/seeds/12_gemm_multiply_leakyrelu.py
    timeout 150 python3 -m kfuse optimize "$seed" --device cuda --backend cuda --set batch_size=64 \
        -o "$work/seed12_cuda.py" --json "$work/seed12_cuda.opt.json" > "$work/seed12_cuda.opt.log" 2>&1
    echo "optimize --backend cuda: exit $? ($(grep -h 'max abs err' "$work/seed12_cuda.opt.log" | head -1))"
    why="$(python3 -c 'from kfuse.judge import sandbox; print(sandbox.unavailable() or "")')"
    flag=""; [ -n "$why" ] && { echo "sandbox unavailable: $why"; flag="--unsandboxed"; }
    timeout 150 python3 -m kfuse eval "$seed" "$work/seed12_cuda.py" --device cuda --set batch_size=64 --seed 5 \
        --perf-trials 30 $flag --json "$work/seed12_cuda.eval.json" > "$work/seed12_cuda.eval.log" 2>&1
    echo "eval: exit $?"
    python3 - "$work/seed12_cuda.eval.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as err:
    sys.exit(f"no eval record ({err})")
print({k: r.get(k) for k in ("correct", "flags", "max_abs_err", "speedup_eager", "kernels", "kernel_count_source",
                             "sandbox", "error")})
print("phases", r.get("phases_s"))
PY
} 2>&1 | tee "$out/gpu_eval.log"
cp "$work"/seed12_cuda.* "$out/" 2>/dev/null || true
