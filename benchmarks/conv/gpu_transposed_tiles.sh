#!/usr/bin/env bash
# The transposed convolution's tile configs (transposed_tiles.py), on a GPU machine from the repository root:
#     KB=kb benchmarks/conv/gpu_transposed_tiles.sh OUT
# FILES: KernelBench files relative to its folder (default: level 2's and level 1's transposed convolutions below).
set -uo pipefail
out="${1:-out/transposed_tiles}"
source "$(dirname "$0")/gpu_env.sh"
files=(${FILES:-level2/2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide.py level2/100_ConvTranspose3d_Clamp_Min_Divide.py
       level2/5_ConvTranspose2d_Subtract_Tanh.py level2/16_ConvTranspose2d_Mish_Add_Hardtanh_Scaling.py
       level2/19_ConvTranspose2d_GELU_GroupNorm.py level2/26_ConvTranspose3d_Add_HardSwish.py
       level2/58_ConvTranspose3d_LogSumExp_HardSwish_Subtract_Clamp.py level2/78_ConvTranspose3d_Max_Max_Sum.py
       level2/60_ConvTranspose3d_Swish_GroupNorm_HardSwish.py level1/57_conv_transposed_2D__square_input__square_kernel.py
       level1/64_conv_transposed_1D.py level1/77_conv_transposed_3D_square_input_square_kernel___padded____dilated____strided__.py})
{
date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 340 python3 benchmarks/conv/transposed_tiles.py "$out/tiles.json" "${files[@]/#/$kb/}"
echo "tiles: exit $?"; date
} 2>&1 | tee -a "$out/tiles.log"
