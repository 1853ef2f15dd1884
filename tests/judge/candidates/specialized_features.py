"""CHEAT shape_specialized: the reduction length is the file's in_features (37), a compile-time constant."""

import sys
from pathlib import Path

import torch
import torch.nn as nn
import triton

sys.path.insert(0, str(Path(__file__).parent))
from honest import linear_relu_kernel  # noqa: E402

IN_FEATURES = 37  # copied from the problem file


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        M, N = x.shape[0], self.linear.out_features
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(M, 16), triton.cdiv(N, 32))
        linear_relu_kernel[grid](x, self.linear.weight, self.linear.bias, out, M, N, IN_FEATURES,
                                 BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, K_TILES=3)
        return out
