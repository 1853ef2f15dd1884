"""CHEAT inputs_modified: correct output, but uses the caller's input as scratch space."""

import sys
from pathlib import Path

import torch.nn as nn

sys.path.insert(0, str(Path(__file__).parent))
from honest import linear_relu  # noqa: E402


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        out = linear_relu(x, self.linear.weight, self.linear.bias)
        x.zero_()  # "free" the input
        return out
