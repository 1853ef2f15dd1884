#!/usr/bin/env bash
# The judge's staging on a GPU (judge/staging.py: raw input files, page-locked device copies): `kfuse eval` of
# kfuse's candidates for problems/gemm 01 (a 32 MB input per timed call) and 04, each twice: caches emptied
# (cold), then again (references and baselines cached: warm). Prints each run's phases and the per-call
# staging time (`timing.protocol.stage_median_ms`; 35 ms for 01 with torch.save staging, runs/h200-suite-*), and
# how long the judge waited for its worker after the references (`worker_ready_wait`: the worker starts, and on the
# GPU warms CUDA and CUPTI (`worker_warmup`), while the references are computed).
#   benchmarks/judge/gpu_staging.sh OUT TGZ [PROBLEM ...]   (TGZ: gpu_throughput.sh make's cands.tgz; PROBLEM: a
#   stem in it, default 01_gemm_gelu 04_gemm_divide_sum_scaling)
set -uo pipefail
out="${1:?output folder}"; tgz="${2:?candidates archive}"; shift 2
problems="${*:-01_gemm_gelu 04_gemm_divide_sum_scaling}"
work=/tmp/kfuse-staging
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$work" KFUSE_JUDGE_CACHE_DIR="$work/judge"
export TORCHINDUCTOR_CACHE_DIR="$work/inductor"
if { ! command -v bwrap || ! command -v prlimit; } >/dev/null 2>&1 && [ -x "$PWD/out/bwrap/bwrap" ]; then export PATH="$PATH:$PWD/out/bwrap"; fi
mkdir -p "$out" "$work"
tar xzf "$tgz" -C "$work"
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
why="$(python3 -c 'from kfuse.judge import sandbox; print(sandbox.unavailable() or "")')"
if [ -n "$why" ]; then echo "sandbox unavailable: $why (running --unsandboxed)"; flag="--unsandboxed"; else echo "sandbox: bwrap"; flag=""; fi
for p in $problems; do
    for run in cold warm; do
        [ "$run" = cold ] && rm -rf "$KFUSE_JUDGE_CACHE_DIR"
        timeout 280 python3 -m kfuse eval "$work/judge-refs/$p.py" "$work/judge-cands/$p.py" --device cuda --seed 21 \
            --perf-trials 100 $flag --json "$out/$p-$run.json" > "$out/$p-$run.log" 2>&1
        echo "$p $run: exit $?"
        python3 - "$out/$p-$run.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as err:
    sys.exit(f"  no record ({err})")
t = r.get("timing") or {}
print(f"  correct {r['correct']} flags {r['flags']} elapsed {r['elapsed_s']} s speedup {r.get('speedup_eager')}")
print(f"  stage_median_ms {(t.get('protocol') or {}).get('stage_median_ms')} candidate ms "
      f"{(t.get('candidate') or {}).get('median_ms')} events ms {(t.get('candidate_events') or {}).get('median_ms')}")
ph = r.get("phases_s") or {}
print("  overlap: references", ph.get("references"), "worker_ready_wait", ph.get("worker_ready_wait"),
      "worker_warmup", ph.get("worker_warmup"), "draws (holds the profiled call)", ph.get("draws"))
print("  phases", ph)
PY
    done
done
} 2>&1 | tee "$out/staging.log"
