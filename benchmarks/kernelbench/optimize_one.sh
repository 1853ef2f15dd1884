#!/bin/bash
# One problem through `kfuse optimize` on the CPU under a 150 s limit; appends "name exit seconds" to results.txt.
# The level-3 sweep: ls ../shared/kernelbench/level3/*.py | xargs -P 2 -n 1 benchmarks/kernelbench/optimize_one.sh
f="$1"; n="$(basename "$f" .py)"
cd "$(dirname "$0")/../.." && mkdir -p "${SWEEP_OUT:-out/kernelbench}"
start=$(date +%s.%N)
COLUMNS=200 timeout 150 .venv/bin/kfuse optimize "$f" --device cpu -o "${SWEEP_OUT:-out/kernelbench}"/${n}_new.py --json "${SWEEP_OUT:-out/kernelbench}"/$n.json > "${SWEEP_OUT:-out/kernelbench}"/$n.log 2>&1
rc=$?
echo "$n $rc $(python3 -c "import time; print(round(time.time() - $start, 1))")" >> "${SWEEP_OUT:-out/kernelbench}"/results.txt
