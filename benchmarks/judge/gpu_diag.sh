#!/usr/bin/env bash
# The judge's clock against CUDA events on an H100 (why honest candidates were flagged timing_inconsistent),
# then candidates made for the suite (carried back as OUT/cands.tgz) and three single judgements:
#   benchmarks/judge/gpu_diag.sh OUT
set -uo pipefail
out="${1:?output folder}"; mkdir -p "$out/evals"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$PWD/.kfuse-cache"
export KFUSE_JUDGE_CACHE_DIR="$PWD/.kfuse-cache/judge" TORCHINDUCTOR_CACHE_DIR="$PWD/.kfuse-cache/inductor"
if { ! command -v bwrap || ! command -v prlimit; } >/dev/null 2>&1 && [ -x "$PWD/out/bwrap/bwrap" ]; then export PATH="$PATH:$PWD/out/bwrap"; fi
{
python3 benchmarks/judge/clock_diag.py "$out/clock_diag.json"
start=$(date +%s)
MAKE_JOBS=8 timeout 300 bash benchmarks/judge/gpu_throughput.sh make "$out/make" | tail -3
echo "make: $(( $(date +%s) - start )) s"
tar czf "$out/cands.tgz" -C .kfuse-cache judge-cands judge-refs
sed 's/^class Model(/class ModelNew(/' problems/gemm/01_gemm_gelu.py > /tmp/eager01.py
c=.kfuse-cache/judge-cands
for pair in "01eager problems/gemm/01_gemm_gelu.py /tmp/eager01.py" \
            "01kfuse problems/gemm/01_gemm_gelu.py $c/01_gemm_gelu.py" \
            "02kfuse problems/gemm/02_gemm_gelu_tanh_scale.py $c/02_gemm_gelu_tanh_scale.py"; do
    set -- $pair
    start=$(date +%s)
    timeout 200 python3 -m kfuse eval "$2" "$3" --device cuda --perf-trials 50 --seed 21 --json "$out/evals/$1.json" \
        > /dev/null 2>&1
    echo "$1: exit $? in $(( $(date +%s) - start )) s"
    python3 - "$out/evals/$1.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no record", e); sys.exit()
t = r.get("timing", {})
print("  correct", r["correct"], "flags", r["flags"], "error", (r.get("error") or "")[:200])
print("  clock", t.get("candidate", {}).get("median_ms"), "events", (t.get("candidate_events") or {}).get("median_ms"),
      "eager", t.get("eager", {}).get("median_ms"), "compile", t.get("compile", {}).get("median_ms"),
      "overhead", t.get("protocol", {}).get("overhead_ms"), "stage", t.get("protocol", {}).get("stage_median_ms"))
print("  phases", r.get("phases_s"))
PY
done
} 2>&1 | tee "$out/run.log"
