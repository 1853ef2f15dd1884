#!/usr/bin/env bash
# On a GPU machine: kfuse optimize each seed problem at full size (contract + eager/kfuse timings).
# Usage: benchmarks/seeds/optimize/optimize-seeds.sh OUTDIR (made the reports in benchmarks/seeds/optimize/)
set -uo pipefail
out="${1:?output folder}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for p in problems/seeds/*.py; do
    n="$(basename "$p" .py)"
    start=$(date +%s)
    python3 -m kfuse optimize "$p" --device cuda -o "$out/${n}_new.py" --json "$out/${n}.json" 2>&1 | tail -8
    echo "$n: exit ${PIPESTATUS[0]} in $(( $(date +%s) - start )) s"
done
