#!/usr/bin/env bash
# The judge on an H100 (issue 21): GPU tests, then eval-suite throughput over >= 20 candidates.
# From the repository root, one phase per call (each stays under 10 minutes):
#   benchmarks/judge/gpu_throughput.sh tests OUT   the judge's GPU tests (timing cheats, kernel counting)
#   benchmarks/judge/gpu_throughput.sh make OUT    candidates: kfuse optimize on 24 problems (resumable: run
#                                                  it again if it stops at its time budget)
#   benchmarks/judge/gpu_throughput.sh cold OUT    eval-suite --jobs $SUITE_JOBS with the judge's caches emptied first
#   benchmarks/judge/gpu_throughput.sh fill OUT    eval-suite over every problem again, caches kept: what a cold run
#                                                  cut by its time left uncached gets cached (the rest is quick)
#   benchmarks/judge/gpu_throughput.sh warm OUT    eval-suite again over the problems the last run judged
#                                                  (baselines and references cached), then OUT/throughput.json
#                                                  over the last two runs
#   benchmarks/judge/gpu_throughput.sh unpack OUT TGZ   candidates made earlier (make's OUT/cands.tgz) instead of make
# OUT may be a fresh folder each call: the suite database lives in the cache folder and is copied to OUT.
# Candidates and the judge's caches live in $KFUSE_SUITE_DIR (default .kfuse-cache/, ignored by git), so `cold` and
# `warm` judge what `make` made; a folder outside the checkout (/tmp/...) outlives a carried checkout between calls.
# Where bubblewrap cannot start on the machine, the runs pass --unsandboxed and the JSON says why.
set -uo pipefail
phase="${1:?phase: tests, make, unpack, cold, fill or warm}"; out="${2:?output folder}"
suite_dir="${KFUSE_SUITE_DIR:-$PWD/.kfuse-cache}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$suite_dir"
export KFUSE_JUDGE_CACHE_DIR="$suite_dir/judge" TORCHINDUCTOR_CACHE_DIR="$suite_dir/inductor"
# a carried bubblewrap (benchmarks/judge/vendor_bwrap.sh) where the machine has none
if { ! command -v bwrap || ! command -v prlimit; } >/dev/null 2>&1 && [ -x "$PWD/out/bwrap/bwrap" ]; then export PATH="$PATH:$PWD/out/bwrap"; fi
mkdir -p "$out" "$suite_dir/judge-cands"
cands="$suite_dir/judge-cands"
db="$suite_dir/judge-suite.db"
refs="$suite_dir/judge-refs"
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
why="$(python3 -c 'from kfuse.judge import sandbox; print(sandbox.unavailable() or "")')"
if [ -n "$why" ]; then echo "sandbox unavailable: $why (running --unsandboxed)"; flag="--unsandboxed"; else echo "sandbox: bwrap"; flag=""; fi
case "$phase" in
tests)
    # TESTS narrows the run (a pytest -k expression); the staging test checks the registered-file path
    TRITON_INTERPRET=0 timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -v -p no:cacheprovider -m gpu -k "${TESTS:-}" \
        tests/judge tests/unit/test_staging.py > "$out/pytest-gpu.log" 2>&1
    grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$out/pytest-gpu.log" | tail -20
    ;;
make)
    # 21 level-2-style GEMM problems and the 3 KernelBench level-2 seeds; a problem kfuse cannot optimize in
    # 60 s leaves no candidate (the suite then has a 'no candidate' row, excluded from the throughput figure)
    mkdir -p "$refs"
    # made side by side (Triton compilation is the CPU's: the machine has 16 cores), each at a small batch (the
    # ModelNew is shape-generic and carries the file's own sizes), full size if the file names no batch_size
    for p in $(ls problems/gemm/*.py | head -21) problems/seeds/*.py; do cp "$p" "$refs/$(basename "$p")"; done
    ls "$refs"/*.py | xargs -P "${MAKE_JOBS:-6}" -I{} sh -c '
        n="$(basename "{}")"; c="'"$cands"'/$n"
        [ -s "$c" ] && exit 0
        timeout 120 python3 -m kfuse optimize "{}" --device cuda --trials 1 --set batch_size=96 -o "$c" > /dev/null 2>&1 \
            || timeout 120 python3 -m kfuse optimize "{}" --device cuda -o "$c" --force > /dev/null 2>&1 || rm -f "$c"
        echo "$n: $([ -s "$c" ] && echo made || echo none)"'
    echo "$(ls "$cands" | wc -l) candidates"
    tar czf "$out/cands.tgz" -C "$suite_dir" judge-cands judge-refs
    ;;
unpack)
    tar xzf "${3:?candidates archive}" -C "$suite_dir"
    echo "$(ls "$cands" | wc -l) candidates"
    ;;
cold|fill|warm)
    [ "$phase" = cold ] && rm -rf "$KFUSE_JUDGE_CACHE_DIR" "$db"
    judge_refs="$refs"
    if [ "$phase" = warm ] && [ -f "$db" ]; then
        # the problems the last run judged to the end (a cold run cut by its timeout leaves the rest uncached:
        # judged here they would be cold again, and the run would not fit its time)
        judge_refs="$suite_dir/judge-refs-warm"; rm -rf "$judge_refs"; mkdir -p "$judge_refs"
        python3 -c "from kfuse.judge.suite import load_run; print('\n'.join(r['problem'] for r in load_run('$db')[1]))" |
            while read -r n; do [ -f "$refs/$n.py" ] && cp "$refs/$n.py" "$judge_refs/"; done
        echo "warm over the $(ls "$judge_refs" | wc -l) problems the last run judged"
    fi
    start=$(date +%s.%N)
    # each record is committed as judged: a run cut short by the timeout still counts what it judged
    timeout "${SUITE_TIMEOUT:-540}" python3 -m kfuse eval-suite "$judge_refs" "$cands" --device cuda --db "$db" --jobs "${SUITE_JOBS:-1}" \
        --seed 21 --perf-trials 100 $flag > "$out/suite-$phase.log" 2>&1
    echo "$phase (jobs ${SUITE_JOBS:-1}): exit $? in $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
    cp "$db" "$out/suite.db"
    python3 benchmarks/judge/summarize.py "$db" "$why" > "$out/throughput.json"
    python3 -c "import json; d = json.load(open('$out/throughput.json')); [print({k: r[k] for k in ('run', 'candidates', 'correct', 'median_beyond_compile_s', 'median_elapsed_s')}) for r in d['runs']]"
    ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
} 2>&1 | tee "$out/$phase.log"
