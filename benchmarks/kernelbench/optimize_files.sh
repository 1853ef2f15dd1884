#!/bin/bash
# `kfuse optimize --device cpu` on a list of KernelBench files, one process at a time, each under SWEEP_LIMIT seconds
# (default 150): LIST holds paths relative to ../shared/kernelbench (level2/1_Conv2D_ReLU_BiasAdd.py, ...); OUT gets
# each problem's report (NAME.json), log and ModelNew, and results.txt lines "levelN/NAME exit seconds" (merge_sweep's
# --timeouts). KFUSE_SRC: run another checkout's code (e.g. a worktree of an earlier commit), else this one's.
#   benchmarks/kernelbench/optimize_files.sh LIST OUT
list="$1"; out="$2"
cd "$(dirname "$0")/../.." && mkdir -p "$out"
while read -r f; do
  n=$(basename "$f" .py); lv=$(dirname "$f")
  start=$(date +%s.%N)
  COLUMNS=200 PYTHONPATH="${KFUSE_SRC:-$PWD/src}" timeout "${SWEEP_LIMIT:-150}" .venv/bin/python -m kfuse optimize \
      "../shared/kernelbench/$f" --device cpu -o "$out/${n}_new.py" --json "$out/$n.json" > "$out/$n.log" 2>&1
  rc=$?
  echo "$lv/$n $rc $(python3 -c "import time; print(round(time.time() - $start, 1))")" >> "$out/results.txt"
done < "$list"
