#!/usr/bin/env bash
# Dense K on a GPU (kernels/conv.py dense_k, KFUSE_CONV_DENSE=1), from the repository root, one device call:
#   KB=path/to/kernelbench benchmarks/conv/gpu_dense.sh OUT [STEP...]
# Steps (default: tests profile bench):
#   tests    dense K's GPU tests: the compiled tile against float64 at every odd geometry of test_conv_kernel and at
#            problem 23's full shape; six problems/conv files, one per kind, through the contract
#   profile  benchmarks/conv/kernel_profile.py at full size on level 2 problems 23, 83, 24, 6 and 8, dense off then
#            on: kernel by kernel, kfuse against eager (the prediction in NOTES.md "Dense K")
#   bench    kfuse bench --baselines eager over the level 2 problems with 3 input channels (not transposed), dense
#            off then on, interleaved problem by problem (the A/B: same machine, same minutes)
# OUT gets dense.log (the summary), profile-{0,1}.json, bench-{0,1}-<problem>.json.
set -uo pipefail
out="${1:?output folder}"; shift || true
steps=("$@"); [ ${#steps[@]} -gt 0 ] || steps=(tests profile bench)
source benchmarks/conv/gpu_env.sh
profiled=(23_Conv3d_GroupNorm_Mean 83_Conv3d_GroupNorm_Min_Clamp_Dropout 24_Conv3d_Min_Softmax
          6_Conv3d_Softmax_MaxPool_MaxPool 8_Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum)
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    for step in "${steps[@]}"; do
        start=$SECONDS
        case "$step" in
        tests)
            timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -k "dense" tests/test_conv_kernel.py \
                tests/test_problems_conv.py > "$out/pytest-dense.log" 2>&1
            echo "tests: exit $? $(tail -1 "$out/pytest-dense.log")";;
        profile)
            for d in 0 1; do
                KFUSE_CONV_DENSE=$d timeout 240 python3 benchmarks/conv/kernel_profile.py "$out/profile-$d.json" \
                    $(for p in "${profiled[@]}"; do echo "$kb/level2/$p.py"; done) --runs 20
                echo "profile dense=$d: exit $?"
            done;;
        bench)
            for f in $(grep -l -E "^in_channels *= *3$" "$kb"/level2/*.py | grep -v Transpose); do
                n=$(basename "$f" .py)
                for d in 0 1; do
                    KFUSE_CONV_DENSE=$d timeout 120 python3 -m kfuse bench "$f" --baselines eager --trials 1 \
                        --json "$out/bench-$d-$n.json" > /dev/null 2>&1
                done
                python3 benchmarks/conv/ab_line.py "$out" "$n" padded=0 dense=1
            done;;
        *) echo "unknown step $step";;
        esac
        echo "== $step: $((SECONDS - start)) s"
    done
} 2>&1 | tee "$out/dense.log"
