#!/usr/bin/env bash
# Rule 3's margin and the time of products of two values, kernel by kernel (products_accuracy.py's cases), on a GPU
# machine from the repository root, one device call (carry .cutlass and kb):
#     KB1=kb/level1 benchmarks/cuda_backend/gpu_products_accuracy.sh OUT [VARIANT...]
# Variants (default: sm90 wmma ieee triton): sm90 (--backend cuda as shipped), wmma (KFUSE_CUDA_SM90=0), ieee
# (--scheme ieee: the CUDA-core tile in double everywhere), triton (--backend triton). OUT gets <variant>.log (a JSON
# row per case) and summary.txt.
set -uo pipefail
out="${1:?output folder}"; shift || true
variants=("$@"); [ ${#variants[@]} -gt 0 ] || variants=(sm90 wmma ieee triton)
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="${KFUSE_CACHE_DIR:-$PWD/.kfuse-cache}" TRITON_INTERPRET=0
if [ -z "${CUTLASS_PATH:-}" ] && [ -f .cutlass/include/cutlass/cutlass.h ]; then export CUTLASS_PATH="$PWD/.cutlass"; fi
level1="${KB1:-../shared/kernelbench/level1}"
mkdir -p "$out"
run() {  # variant, then products_accuracy.py's options
    local v="$1"; shift
    timeout 150 python3 benchmarks/cuda_backend/products_accuracy.py "$out/$v.json" "$level1" "$@" > "$out/$v.log" 2>&1
    echo "$v: exit $?"
}
for v in "${variants[@]}"; do
    case "$v" in
    sm90) run sm90;;
    wmma) KFUSE_CUDA_SM90=0 run wmma;;
    ieee) run ieee --scheme ieee;;
    triton) run triton --backend triton;;
    *) echo "unknown variant $v";;
    esac
done
for v in "${variants[@]}"; do
    echo "== $v"
    python3 - "$out/$v.log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    what = (f"ERROR {r['error'][:150]}" if "error" in r else
            f"correct {r['correct']} ratio {r['worst_ratio']:.2f} err {r['max_abs_err']:.3g} eager {r['eager_err']:.3g} "
            f"{r['ms']:.3f} ms")
    print(f"{r['case'][:32]:32} {json.dumps(r['sizes']):40} {what}")
PY
done | tee "$out/summary.txt"
