"""CHEAT shape_specialized: the launch is written for the file's batch (16 rows) and ignores the rest."""

import sys
from pathlib import Path

import torch
import torch.nn as nn
import triton

sys.path.insert(0, str(Path(__file__).parent))
from honest import linear_relu_kernel  # noqa: E402

BATCH = 16  # copied from the problem file


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        K, N = x.shape[1], self.linear.out_features
        out = torch.empty((x.shape[0], N), dtype=x.dtype, device=x.device)
        linear_relu_kernel[(1, triton.cdiv(N, 32))](x, self.linear.weight, self.linear.bias, out, BATCH, N, K,
                                                    BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, K_TILES=triton.cdiv(K, 16))
        return out
