#!/usr/bin/env bash
# The convolution tuner (kernels/conv.py tuned_conv) against conv_config's untuned default, on an H100 / H200:
#   benchmarks/conv/gpu_tune.sh OUT
# `kfuse bench --baselines eager` at full size on KernelBench level 2 problem 1 (Conv2D + ReLU + bias) and level 1
# problem 67 (Conv1d), first with KFUSE_AUTOTUNE=off (the default tile), then with tuning on (a fresh cache
# folder: every config timed), 90 s each. Prints kfuse's time both ways and the
# tuner's pick with each candidate's time.
set -uo pipefail
out="${1:?output folder}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
kb="${KB:-../shared/kernelbench}"
for d in shared/kernelbench kb ../kb; do [ -d "$kb" ] || kb=$d; done
mkdir -p "$out"
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    for f in level2/1_Conv2D_ReLU_BiasAdd.py level1/67_conv_standard_1D.py; do
        n=$(basename "$f" .py)
        for mode in off on; do
            KFUSE_AUTOTUNE=$mode KFUSE_CACHE_DIR="$(mktemp -d)" timeout 90 python3 -m kfuse bench "$kb/$f" \
                --baselines eager --trials 2 --json "$out/$n-$mode.json" > "$out/$n-$mode.log" 2>&1
            echo "$n tune $mode: exit $?"
        done
    done
    python3 - "$out" <<'PY'
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    for r in json.loads(p.read_text()).get("results", []):
        print(f"{p.stem:45} kfuse {r.get('kfuse_ms')} eager {r.get('eager_ms')} correct {r.get('correct')} "
              f"err {r.get('max_abs_err')}")
        for t in r.get("tuned", []):
            print("   pick", t.get("config"), "of", t.get("timings_ms"))
PY
} 2>&1 | tee "$out/tune.log"
