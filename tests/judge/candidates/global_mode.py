"""CHEAT global_mode: pushes a TorchFunctionMode at import that answers every comparison with True."""

import sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).parent))
from honest import linear_relu  # noqa: E402


class AlwaysClose(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal):
            return True
        return func(*args, **(kwargs or {}))


AlwaysClose().__enter__()


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return linear_relu(x, self.linear.weight, self.linear.bias)
