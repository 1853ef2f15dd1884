#!/usr/bin/env bash
# The direct tile on a GPU (kernels/conv_direct.py; KFUSE_CONV_DIRECT=0 turns it off), from the repository root:
#   KB=path/to/kernelbench benchmarks/conv/gpu_direct.sh OUT [STEP...]
# Steps (default: tests micro profile):
#   tests    the direct tile's GPU tests (every odd geometry and problem 23's full shape against float64, both
#            direct schemes; the six few-channel problems/conv files, one per kind, through the contract; the
#            depthwise convolution at level 1 problem 82's full size, now on the same loop)
#   micro    benchmarks/conv/direct_bench.py: the first convolution of level 2 problems with 3 and 8 input channels
#            and of level 1's 3-channel Conv3d problems, alone: padded tile, direct64, direct32, cuDNN
#   profile  benchmarks/conv/kernel_profile.py at full size on the 3-channel level 2 problems, direct off then on
#   bench    kfuse bench --baselines eager over the level 2 and level 1 problems with 3 input channels (not
#            transposed), direct off then on, interleaved problem by problem (the A/B); LEVELS (default "level2
#            level1") and SETTINGS (default "0 1", KFUSE_CONV_DIRECT's values) narrow it; BASELINES (default
#            "eager,eager_strict") picks the baselines
# OUT gets direct.log (the summary), pytest-direct.log, micro.json, profile-{0,1}.json, bench-{0,1}-<problem>.json.
set -uo pipefail
out="${1:?output folder}"; shift || true
steps=("$@"); [ ${#steps[@]} -gt 0 ] || steps=(tests micro profile)
source benchmarks/conv/gpu_env.sh
three=(23_Conv3d_GroupNorm_Mean 83_Conv3d_GroupNorm_Min_Clamp_Dropout 24_Conv3d_Min_Softmax
       6_Conv3d_Softmax_MaxPool_MaxPool 79_Conv3d_Multiply_InstanceNorm_Clamp_Multiply_Max
       27_Conv3d_HardSwish_GroupNorm_Mean 48_Conv3d_Scaling_Tanh_Multiply_Sigmoid)
eight=(8_Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum 67_Conv2d_GELU_GlobalAvgPool 85_Conv2d_GroupNorm_Scale_MaxPool_Clamp
       57_Conv2d_ReLU_HardSwish)
level1=(54_conv_standard_3D__square_input__square_kernel 59_conv_standard_3D__asymmetric_input__square_kernel)
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    for step in "${steps[@]}"; do
        start=$SECONDS
        case "$step" in
        tests)
            timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -k "direct or depthwise" \
                tests/test_conv_direct.py tests/test_conv_depthwise.py tests/test_problems_conv.py \
                > "$out/pytest-direct.log" 2>&1
            echo "tests: exit $? $(tail -1 "$out/pytest-direct.log")";;
        micro)
            timeout 240 python3 benchmarks/conv/direct_bench.py "$out/micro.json" \
                $(for p in "${three[@]:0:1}" "${three[@]:5:2}" "${eight[@]}"; do echo "$kb/level2/$p.py"; done) \
                $(for p in "${level1[@]}"; do echo "$kb/level1/$p.py"; done)
            echo "micro: exit $?";;
        profile)
            for d in 0 1; do
                KFUSE_CONV_DIRECT=$d timeout 150 python3 benchmarks/conv/kernel_profile.py "$out/profile-$d.json" \
                    $(for p in "${three[@]}"; do echo "$kb/level2/$p.py"; done) --runs 20
                echo "profile direct=$d: exit $?"
            done;;
        bench)
            for f in $(for l in ${LEVELS:-level2 level1}; do grep -l -E "^in_channels *= *3$" "$kb/$l"/*.py; done \
                       | grep -v -i transpose); do
                n=$(basename "$f" .py)
                for d in ${SETTINGS:-0 1}; do
                    KFUSE_CONV_DIRECT=$d timeout 120 python3 -m kfuse bench "$f" --baselines "${BASELINES:-eager,eager_strict}" \
                        --trials 1 --json "$out/bench-$d-$n.json" > /dev/null 2>&1
                done
                python3 benchmarks/conv/ab_line.py "$out" "$n" padded=0 direct=1 "float64 direct=64"
            done;;
        *) echo "unknown step $step";;
        esac
        echo "== $step: $((SECONDS - start)) s"
    done
} 2>&1 | tee "$out/direct.log"
