#!/usr/bin/env bash
# The GPU check of `--backend cuda` with the Hopper GEMM (CUTLASS's TMA + wgmma kernel, gemm_sm90_source.py), on
# a GPU machine from the repository root:
#     benchmarks/cuda_backend/gpu_sm90.sh OUT STEP...
# Steps (each writes under OUT; run several in one call or one per call, the built extensions stay in
# KFUSE_CACHE_DIR, default ./.kfuse-cache, between calls on the same machine):
#   smoke   kfuse optimize --backend cuda of seed 12 (builds the extension, checks the contract), then the GPU
#           tests of the odd sizes (both schemes) and the CUDA-core kernels against their CPU models
#   verify  kfuse optimize --backend cuda of every seed and every problems/gemm file, 14 at a time (nvcc dominates)
#   bench   kfuse bench of the seeds, --backend cuda then --backend triton, eager beside each (one contract draw)
#   tests   the rest of the GPU tests of tests/test_cuda_backend.py (gradients, second process, GEMV timing)
#   kinds   the norm and row-sum kinds: kfuse optimize --backend cuda of tests/test_cuda_norms.py's cases, of the
#           Model with a region of every kind (tests/test_cuda_backend.py's EVERY_KIND) and of problems/gemm/04 and
#           05 (row sums), 8 at a time (which builds their extensions), then the GPU tests of test_cuda_norms.py and
#           test_cuda_backend.py's tests of 04
#   rowkinds  the row reduction and pool kinds: kfuse optimize --backend cuda of the problems/gemm files they fuse,
#           8 at a time, then tests/test_cuda_row_kinds.py's GPU tests, then kfuse bench of six of them with each
#           backend (their CUDA extensions built by the optimize runs)
#   twins   each CUDA kind against its Triton twin: kfuse bench --backend cuda, then triton, of problems/gemm 08
#           (gemm_groupnorm_wide), 30 and 38 (gemm_batchnorm, training and eval) and 04 (gemm_rowsum), their
#           extensions built first by kfuse optimize, 4 at a time
#   products  products of two values (fused by default): kfuse optimize --backend cuda of KernelBench's level-1
#           products (KB1: a folder of its level-1 files, default ../shared/kernelbench/level1, or KB1=kb/level1 with
#           kb carried; full size), 6 at a
#           time, then tests/test_cuda_products.py's GPU tests, then kfuse bench of four of them with each backend
#   variants  tile, cluster and promotion variants of the Hopper GEMM on seed 12 (sm90_variants.py)
#   wmma    kfuse bench of seed 12 with KFUSE_CUDA_SM90=0 (the WMMA tile; the A/B against the Hopper kernel)
#   conv    the convolution kind (kfuse/cuda/conv.py): kfuse optimize --backend cuda of the problems/conv files it
#           takes whole (tests/test_cuda_conv.py's PLAIN, TRANSPOSED and DEPTHWISE, and 30), 12 at a time, then that
#           file's GPU tests (their extensions built by then), then seed 12 with KFUSE_CUDA_SM90=0 (the WMMA GEMM,
#           whose mainloop the conv tile shares)
#   convgroups  the grouped problems/conv files (06, 15, 28) and 01 through kfuse optimize --backend cuda, 4 at a time,
#           beside tests/test_cuda_conv.py's GPU test of the kernel against its model (grouped geometries too)
#   convdirect  the direct tile (kfuse/cuda/conv_direct_source.py): kfuse optimize --backend cuda of the problems/conv
#           files it runs (tests/test_cuda_conv.py's DIRECT_FILES) and of KBFILES (paths, full size), 12 at a time,
#           then that file's GPU tests of the direct tile, then kfuse bench of KBFILES with each backend (BACKENDS,
#           default "cuda triton")
#   convnorms  the norm after a convolution (kfuse/cuda/conv_norms.py, on unless KFUSE_CUDA_CONV_NORMS=0): kfuse
#           optimize --backend cuda of tests/test_cuda_conv_norms.py's NORM_FILES, 4 at a time, then that file's GPU
#           tests (both tiles)
#   normsoff  the A/B of the norm after a convolution: kfuse bench --backend cuda of KernelBench level 2's NORMSOFF
#           (default 17 23 61) with KFUSE_CUDA_CONV_NORMS=0 (the convolution's region, then the norm as torch calls)
#   convbn  the BatchNorm after a convolution (kfuse/cuda/conv_norms.py): kfuse optimize --backend cuda of
#           tests/test_cuda_conv_norms.py's BN_FILES, 5 at a time, then that file's GPU tests of them (both tiles)
#   convpools  the pool after a convolution (kfuse/cuda/conv_pools.py, off unless KFUSE_CUDA_CONV_POOLS=1): with the
#           switch on, kfuse optimize --backend cuda of tests/test_cuda_conv_pools.py's POOL_FILES, 4 at a time, then
#           that file's GPU tests (both tiles, a mean of pooled values); KernelBench level 2's pools: convkb with the
#           switch exported (e.g. CONVKB="35 46 65 67 82"), and without it for the A/B
#   convchannels  the reduction over a convolution's channels (kfuse/cuda/conv_channels.py): kfuse optimize
#           --backend cuda of tests/test_cuda_conv_channels.py's CHANNEL_FILES, 4 at a time, then that file's GPU tests
#           (both tiles, each reduction)
#   convkb  KernelBench level 2's convolutions the kind takes with everything after them (CONVKB, default 1 4 47 54
#           87 90; KB2: a folder of its level-2 files, default kb/level2, carried), full size, 4 at a time, then
#           kfuse bench of them with each backend (BACKENDS, default "cuda triton")
# CUTLASS's headers: $CUTLASS_PATH/include, else ./.cutlass/include (a copy carried to a machine without the pip
# package), else the nvidia-cutlass package's. Needs nvcc and ninja (torch's load_inline).
set -uo pipefail
out="${1:-out/cuda_sm90}"
shift || true
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="${KFUSE_CACHE_DIR:-$PWD/.kfuse-cache}"
if [ -z "${CUTLASS_PATH:-}" ] && [ -f .cutlass/include/cutlass/cutlass.h ]; then export CUTLASS_PATH="$PWD/.cutlass"; fi
mkdir -p "$out/cuda" "$KFUSE_CACHE_DIR"
seeds=(problems/seeds/*.py)
optimize_one() {  # problem file, output folder
    local n; n="$(basename "$1" .py)"
    timeout 420 python3 -m kfuse optimize "$1" --backend cuda --trials 2 -o "$2/$n.py" --json "$2/$n.json" \
        > "$2/$n.log" 2>&1
    echo "$n: exit $? $(grep -E "^contract|^max abs|error" "$2/$n.log" | tr '\n' ' ' | cut -c1-300)"
}
export -f optimize_one
{
date
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
python3 -c "from kfuse.cuda.runtime import cutlass_include, sm90_headers; print('cutlass', cutlass_include(), 'sm90 build', sm90_headers() is not None)"
for step in "$@"; do
    start=$SECONDS
    echo "== $step =="
    case "$step" in
    smoke)
        optimize_one problems/seeds/12_gemm_multiply_leakyrelu.py "$out/cuda"
        TRITON_INTERPRET=0 timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_backend.py \
            -k "odd_sizes or bit_for_bit" > "$out/pytest-smoke.log" 2>&1
        echo "pytest: exit $? $(tail -1 "$out/pytest-smoke.log")";;
    verify14)  # the problems/gemm files a change of the promotion interval can move (a sum over outputs)
        printf '%s\n' problems/gemm/14_*.py problems/gemm/04_*.py problems/gemm/05_*.py problems/gemm/15_*.py \
            problems/seeds/39_*.py | xargs -P 5 -I{} bash -c 'optimize_one {} '"$out/cuda"
        ;;
    verify)
        printf '%s\n' "${seeds[@]}" problems/gemm/*.py | xargs -P 14 -I{} bash -c 'optimize_one {} '"$out/cuda"
        ;;
    bench)
        timeout 200 python3 -m kfuse bench "${seeds[@]}" --baselines eager --trials 1 --backend cuda \
            --json "$out/bench-cuda.json" --plot "$out/bench-cuda.png" > "$out/bench-cuda.log" 2>&1
        echo "bench cuda: exit $?"; tail -12 "$out/bench-cuda.log"
        timeout 200 python3 -m kfuse bench "${seeds[@]}" --baselines eager --trials 1 --backend triton \
            --json "$out/bench-triton.json" > "$out/bench-triton.log" 2>&1
        echo "bench triton: exit $?"; tail -12 "$out/bench-triton.log";;
    tests)
        TRITON_INTERPRET=0 timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_backend.py \
            -k "not odd_sizes and not bit_for_bit" > "$out/pytest-rest.log" 2>&1
        echo "pytest: exit $? $(tail -1 "$out/pytest-rest.log")";;
    kinds)
        mkdir -p "$out/kind_cases" "$out/kinds"
        python3 -c "
import sys; sys.path[:0] = ['tests']
from pathlib import Path
from kfuse_testing import write_problem
from test_cuda_norms import CASES, EVERY_KIND, _problem
for name in CASES: _problem(Path(sys.argv[1]), name)
write_problem(Path(sys.argv[1]), *EVERY_KIND, name='every_kind')" "$out/kind_cases"
        printf '%s\n' "$out"/kind_cases/*.py problems/gemm/04_*.py problems/gemm/05_*.py \
            | xargs -P 8 -I{} bash -c 'optimize_one {} '"$out/kinds"
        TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_norms.py \
            tests/test_cuda_backend.py -k "norm or every_kind or 04_gemm" > "$out/pytest-kinds.log" 2>&1
        echo "pytest: exit $? $(tail -1 "$out/pytest-kinds.log")";;
    rowkinds)
        mkdir -p "$out/rowkinds"
        ls problems/gemm/{06,14,15,18,23,31,32,33,34,39,40,42}_*.py | xargs -P 8 -I{} bash -c 'optimize_one {} '"$out/rowkinds"
        TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_row_kinds.py \
            > "$out/pytest-rowkinds.log" 2>&1
        echo "pytest: exit $? $(tail -1 "$out/pytest-rowkinds.log")"
        rows=(problems/gemm/{06,14,32,31,34,33}_*.py)
        for b in cuda triton; do
            timeout 230 python3 -m kfuse bench "${rows[@]}" --baselines eager --trials 1 --backend $b \
                --json "$out/rowkinds-bench-$b.json" > "$out/rowkinds-bench-$b.log" 2>&1
            echo "bench $b: exit $?"
        done;;
    products)
        mkdir -p "$out/products"
        kb1="$(realpath "${KB1:-../shared/kernelbench/level1}")"
        export KB1="$kb1"
        ls "$kb1"/{1,2,3,4,6,7,8,9,10,13,16,17,18}_*.py | xargs -P 6 -I{} bash -c 'optimize_one {} '"$out/products"
        TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_products.py \
            > "$out/pytest-products.log" 2>&1
        echo "pytest: exit $? $(tail -1 "$out/pytest-products.log")"
        prods=("$kb1"/{1,2,3,10,17}_*.py)
        for b in cuda triton; do
            timeout 230 python3 -m kfuse bench "${prods[@]}" --baselines eager --trials 1 --backend $b \
                --json "$out/products-bench-$b.json" > "$out/products-bench-$b.log" 2>&1
            echo "bench $b: exit $?"
        done
        ;;
    twins)
        twins=(problems/gemm/08_*.py problems/gemm/30_*.py problems/gemm/38_*.py problems/gemm/04_*.py)
        printf '%s\n' "${twins[@]}" | xargs -P 4 -I{} bash -c 'optimize_one {} '"$out/cuda"
        for b in cuda triton; do
            timeout 200 python3 -m kfuse bench "${twins[@]}" --baselines eager --trials 1 --backend $b \
                --json "$out/twins-$b.json" > "$out/twins-$b.log" 2>&1
            echo "bench $b: exit $?"
        done;;
    variants)  # the Hopper GEMM's variants on seed 12 (sm90_variants.py): built in parallel, timed one by one
        vs=(${VARIANTS:-split p1 p2 p4 wmma})
        for v in "${vs[@]}"; do
            timeout 300 python3 benchmarks/cuda_backend/sm90_variants.py "$v" --build-only > "$out/build-$v.log" 2>&1 &
        done
        wait
        timeout 200 python3 benchmarks/cuda_backend/sm90_variants.py "${vs[@]}" --json "$out/variants.json" \
            2>&1 | tail -8;;
    wmma)
        KFUSE_CUDA_SM90=0 timeout 200 python3 -m kfuse bench problems/seeds/12_gemm_multiply_leakyrelu.py \
            --baselines eager --trials 1 --backend cuda --json "$out/bench-wmma.json" > "$out/bench-wmma.log" 2>&1
        echo "bench wmma: exit $?"; tail -6 "$out/bench-wmma.log";;
    conv)
        mkdir -p "$out/conv"
        python3 -c "import sys; sys.path[:0] = ['tests']; from test_cuda_conv import PLAIN, TRANSPOSED, DEPTHWISE; \
print(*PLAIN, *TRANSPOSED, *DEPTHWISE, '30_conv2d_down_conv_transpose2d_up', sep='\n')" \
            | sed 's|^|problems/conv/|; s|$|.py|' | xargs -P 12 -I{} bash -c 'optimize_one {} '"$out/conv"
        TRITON_INTERPRET=0 timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_conv.py \
            > "$out/pytest-conv.log" 2>&1
        echo "pytest: exit $? $(tail -1 "$out/pytest-conv.log")"
        grep -E "^FAILED|Error" "$out/pytest-conv.log" | head -20
        KFUSE_CUDA_SM90=0 optimize_one problems/seeds/12_gemm_multiply_leakyrelu.py "$out/conv";;
    convgroups)
        mkdir -p "$out/convgroups"
        (TRITON_INTERPRET=0 timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_conv.py -k model \
            > "$out/pytest-convgroups.log" 2>&1; echo "pytest: exit $? $(tail -1 "$out/pytest-convgroups.log")") &
        ls problems/conv/{06,15,28,01}_*.py | xargs -P 4 -I{} bash -c 'optimize_one {} '"$out/convgroups"
        wait;;
    convdirect)
        mkdir -p "$out/convdirect"
        read -ra kbfiles <<< "${KBFILES:-}"
        { python3 -c "import sys; sys.path[:0] = ['tests']; from test_cuda_conv import DIRECT_FILES; \
print(*DIRECT_FILES, sep='\n')" | sed 's|^|problems/conv/|; s|$|.py|'; printf '%s\n' "${kbfiles[@]}"; } \
            | grep . | xargs -P 12 -I{} bash -c 'optimize_one {} '"$out/convdirect"
        TRITON_INTERPRET=0 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_conv.py \
            -k direct > "$out/pytest-convdirect.log" 2>&1
        echo "pytest: exit $? $(tail -1 "$out/pytest-convdirect.log")"
        grep -E "^FAILED|Error" "$out/pytest-convdirect.log" | head -20
        if [ ${#kbfiles[@]} -gt 0 ]; then for b in ${BACKENDS:-cuda triton}; do
            timeout 150 python3 -m kfuse bench "${kbfiles[@]}" --baselines eager --trials 1 --backend $b \
                --json "$out/convdirect-bench-$b.json" > "$out/convdirect-bench-$b.log" 2>&1
            echo "bench $b: exit $?"; tail -$((2 * ${#kbfiles[@]} + 1)) "$out/convdirect-bench-$b.log"
        done; fi;;
    convnorms)
        mkdir -p "$out/convnorms"
        python3 -c "import sys; sys.path[:0] = ['tests']; from test_cuda_conv_norms import NORM_FILES; \
print(*NORM_FILES, sep='\n')" | sed 's|^|problems/conv/|; s|$|.py|' | xargs -P 4 -I{} bash -c 'optimize_one {} '"$out/convnorms"
        TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_conv_norms.py \
            > "$out/pytest-convnorms.log" 2>&1
        echo "pytest: exit $? $(tail -1 "$out/pytest-convnorms.log")"
        grep -E "^FAILED|Error" "$out/pytest-convnorms.log" | head -20;;
    normsoff)
        kb2="$(realpath "${KB2:-kb/level2}")"
        files=(); for n in ${NORMSOFF:-17 23 61}; do files+=("$kb2/${n}_"*.py); done
        KFUSE_CUDA_CONV_NORMS=0 timeout 230 python3 -m kfuse bench "${files[@]}" --baselines eager --trials 1 \
            --backend cuda --json "$out/normsoff-bench-cuda.json" > "$out/normsoff-bench-cuda.log" 2>&1
        echo "bench: exit $?"; tail -$((2 * ${#files[@]} + 1)) "$out/normsoff-bench-cuda.log";;
    convbn)
        mkdir -p "$out/convbn"
        python3 -c "import sys; sys.path[:0] = ['tests']; from test_cuda_conv_norms import BN_FILES; \
print(*BN_FILES, sep='\n')" | sed 's|^|problems/conv/|; s|$|.py|' | xargs -P 5 -I{} bash -c 'optimize_one {} '"$out/convbn"
        TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_conv_norms.py \
            -k batchnorm > "$out/pytest-convbn.log" 2>&1
        echo "pytest: exit $? $(tail -1 "$out/pytest-convbn.log")"
        grep -E "^FAILED|Error" "$out/pytest-convbn.log" | head -20;;
    convpools)
        mkdir -p "$out/convpools"
        export KFUSE_CUDA_CONV_POOLS=1
        python3 -c "import sys; sys.path[:0] = ['tests']; from test_cuda_conv_pools import POOL_FILES; \
print(*POOL_FILES, sep='\n')" | sed 's|^|problems/conv/|; s|$|.py|' | xargs -P 4 -I{} bash -c 'optimize_one {} '"$out/convpools"
        TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_conv_pools.py \
            > "$out/pytest-convpools.log" 2>&1
        echo "pytest: exit $? $(tail -1 "$out/pytest-convpools.log")"
        grep -E "^FAILED|Error" "$out/pytest-convpools.log" | head -20
        unset KFUSE_CUDA_CONV_POOLS;;
    convchannels)
        mkdir -p "$out/convchannels"
        python3 -c "import sys; sys.path[:0] = ['tests']; from test_cuda_conv_channels import CHANNEL_FILES; \
print(*CHANNEL_FILES, sep='\n')" | sed 's|^|problems/conv/|; s|$|.py|' \
            | xargs -P 4 -I{} bash -c 'optimize_one {} '"$out/convchannels"
        TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu \
            tests/test_cuda_conv_channels.py > "$out/pytest-convchannels.log" 2>&1
        echo "pytest: exit $? $(tail -1 "$out/pytest-convchannels.log")"
        grep -E "^FAILED|Error" "$out/pytest-convchannels.log" | head -20;;
    convkb)
        mkdir -p "$out/convkb"
        kb2="$(realpath "${KB2:-kb/level2}")"
        files=(); for n in ${CONVKB:-1 4 47 54 87 90}; do files+=("$kb2/${n}_"*.py); done
        printf '%s\n' "${files[@]}" | xargs -P 4 -I{} bash -c 'optimize_one {} '"$out/convkb"
        for b in ${BACKENDS:-cuda triton}; do
            timeout 230 python3 -m kfuse bench "${files[@]}" --baselines eager --trials 1 --backend $b \
                --json "$out/convkb-bench-$b.json" > "$out/convkb-bench-$b.log" 2>&1
            echo "bench $b: exit $?"; tail -${#files[@]} "$out/convkb-bench-$b.log"
        done;;
    *) echo "unknown step $step";;
    esac
    echo "$step: $((SECONDS - start)) s"
done
date
} 2>&1 | tee -a "$out/gpu_sm90.log"
