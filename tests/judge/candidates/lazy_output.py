"""CHEAT lazy_output: returns a tensor subclass (a lazy/deferred result type), not a plain tensor."""

import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).parent))
from honest import linear_relu  # noqa: E402


class LazyResult(torch.Tensor):
    """Pretends to be a result; a real lazy tensor would compute on first read."""


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return linear_relu(x, self.linear.weight, self.linear.bias).as_subclass(LazyResult)
