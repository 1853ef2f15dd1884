#!/bin/bash
# One problem through `kfuse optimize` on the CPU under a time limit (SWEEP_LIMIT seconds, default 150); appends
# "name exit seconds" to results.txt. The level-3 sweep:
#   ls ../shared/kernelbench/level3/*.py | xargs -P 2 -n 1 benchmarks/kernelbench/optimize_one.sh
# The seven level-3 reruns of cpu-sweep.md (one at a time, 3600 s each; README.md):
#   for n in 11_VGG16 12_VGG19 5_AlexNet 30_SwinTransformerV2 9_ResNet18 10_ResNet101 24_EfficientNetB2; do
#     SWEEP_LIMIT=3600 nice -n 10 benchmarks/kernelbench/optimize_one.sh ../shared/kernelbench/level3/$n.py; done
f="$1"; n="$(basename "$f" .py)"
cd "$(dirname "$0")/../.." && mkdir -p "${SWEEP_OUT:-out/kernelbench}"
start=$(date +%s.%N)
COLUMNS=200 timeout "${SWEEP_LIMIT:-150}" .venv/bin/kfuse optimize "$f" --device cpu -o "${SWEEP_OUT:-out/kernelbench}"/${n}_new.py --json "${SWEEP_OUT:-out/kernelbench}"/$n.json > "${SWEEP_OUT:-out/kernelbench}"/$n.log 2>&1
rc=$?
echo "$n $rc $(python3 -c "import time; print(round(time.time() - $start, 1))")" >> "${SWEEP_OUT:-out/kernelbench}"/results.txt
