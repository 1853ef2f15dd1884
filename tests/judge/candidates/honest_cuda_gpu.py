"""Honest control (GPU): relu(x) * scale in one CUDA C++ kernel built with torch.utils.cpp_extension.load_inline."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA = r"""
#include <torch/extension.h>

__global__ void scale_relu_cuda_kernel(const float* x, float* out, float scale, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(x[i], 0.0f) * scale;
}

torch::Tensor scale_relu(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    scale_relu_cuda_kernel<<<(n + 255) / 256, 256>>>(xc.data_ptr<float>(), out.data_ptr<float>(), (float)scale, n);
    return out;
}
"""
CPP = "torch::Tensor scale_relu(torch::Tensor x, double scale);"
ext = load_inline("kfuse_judge_scale_relu", cpp_sources=CPP, cuda_sources=CUDA, functions=["scale_relu"],
                  verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return ext.scale_relu(x, self.scale)
