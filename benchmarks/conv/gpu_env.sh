# Sourced by the conv GPU scripts after they set `out`: kfuse from this checkout, compiled kernels (not the
# interpreter), the tuner's disk cache under the checkout, `kb` the KernelBench folder (KB, else ../shared/kernelbench,
# else ./kb, a copy carried to the device), and OUT made.
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="${KFUSE_CACHE_DIR:-$PWD/.kfuse-cache}" TRITON_INTERPRET=0
kb="${KB:-../shared/kernelbench}"
for d in ../shared/kernelbench kb; do [ -d "$kb/level2" ] || kb=$d; done
mkdir -p "$out"
