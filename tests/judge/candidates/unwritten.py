"""CHEAT unwritten_output: the kernel skips the last output row, hoping the memory already holds it
(in KernelBench's evaluator it can: the reference's freed output)."""

import sys
from pathlib import Path

import torch
import torch.nn as nn
import triton

sys.path.insert(0, str(Path(__file__).parent))
from honest import linear_relu_kernel  # noqa: E402


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        M, K = x.shape
        N = self.linear.out_features
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(M, 16), triton.cdiv(N, 32))
        linear_relu_kernel[grid](x, self.linear.weight, self.linear.bias, out, M - 1, N, K,
                                 BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, K_TILES=triton.cdiv(K, 16))
        return out
