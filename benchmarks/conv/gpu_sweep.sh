#!/usr/bin/env bash
# KernelBench's convolution problems at full size, one `kfuse bench` per file, on a GPU machine from the repository
# root:
#     KB=kb NUMS="1 2 3" BUDGET=500 benchmarks/conv/gpu_sweep.sh OUT
# Each file writes OUT/LEVEL-N.json (the contract checked on one draw set plus the extra shape: --trials 1), so a
# call cut by the device's limit keeps every file it finished; no file is started once BUDGET seconds have passed.
# Merge the calls' files with benchmarks/merge_bench.py. LEVEL (default level2), BASELINES (default
# eager,eager_strict), PER_FILE (seconds, default 150), COMMIT (the commit the caller sent, written into each JSON:
# the device's copy of the tree has no git metadata).
# The tuner's disk cache: TUNE_CACHE (default benchmarks/conv/h200-autotune.json), when it exists, seeds it, and the
# call writes it back as OUT/autotune.json; put that file at TUNE_CACHE before the next call, and a kernel already
# tuned at its geometry on this GPU kind (the key holds the GPU, the kernel's source hash and the shape) is not tuned
# again: the tuner's first call took 20-25 of a file's 23-68 s on an H200. `--retune` is not passed, so the JSONs
# say which configs came from the disk (`tuned[].from_disk`).
set -uo pipefail
out="${1:-out/sweep}"
source "$(dirname "$0")/gpu_env.sh"
level="${LEVEL:-level2}"
cache_in="${TUNE_CACHE:-benchmarks/conv/h200-autotune.json}"
if [ -f "$cache_in" ]; then mkdir -p "$KFUSE_CACHE_DIR" && cp "$cache_in" "$KFUSE_CACHE_DIR/autotune.json"; fi
start=$SECONDS
{
date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for n in ${NUMS:?NUMS: the problem numbers}; do
    if (( SECONDS - start > ${BUDGET:-500} )); then echo "budget spent: not started $n"; continue; fi
    f=$(ls "$kb/$level/${n}_"*.py)
    t0=$SECONDS
    timeout "${PER_FILE:-150}" python3 -m kfuse bench "$f" --baselines "${BASELINES:-eager,eager_strict}" --trials 1 \
        --json "$out/$level-$n.json" > "$out/$level-$n.log" 2>&1
    rc=$?
    if [ -n "${COMMIT:-}" ] && [ -f "$out/$level-$n.json" ]; then  # the device's copy has no git metadata
        python3 -c "import json, sys; p = sys.argv[1]; d = json.load(open(p)); d['commit'] = sys.argv[2]
json.dump(d, open(p, 'w'), indent=2)" "$out/$level-$n.json" "$COMMIT"
    fi
    # the verdict from the JSON (the log's table wraps long problem names)
    verdict=$(python3 -c "import json, sys; r = json.load(open(sys.argv[1]))['results'][0]
print('contract met' if r['correct'] else 'contract FAILED')" "$out/$level-$n.json" 2>/dev/null || echo "no JSON")
    echo "$level $n: exit $rc in $((SECONDS - t0)) s: $verdict"
done
date
} 2>&1 | tee -a "$out/sweep.log"
if [ -f "$KFUSE_CACHE_DIR/autotune.json" ]; then cp "$KFUSE_CACHE_DIR/autotune.json" "$out/autotune.json"; fi
