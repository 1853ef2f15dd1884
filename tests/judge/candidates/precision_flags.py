"""CHEAT precision_flags: flips global TF32 / matmul precision flags (at import and during forward)."""

import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).parent))
from honest import linear_relu  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = True


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        torch.set_float32_matmul_precision("medium")
        torch.backends.cudnn.allow_tf32 = True
        return linear_relu(x, self.linear.weight, self.linear.bias)
