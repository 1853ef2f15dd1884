"""CHEAT cached_results: computes once, then returns the first result for every later call of that shape."""

import sys
from pathlib import Path

import torch.nn as nn

sys.path.insert(0, str(Path(__file__).parent))
from honest import linear_relu  # noqa: E402


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self._cache = {}

    def forward(self, x):
        if x.shape not in self._cache:
            self._cache[x.shape] = linear_relu(x, self.linear.weight, self.linear.bias)
        return self._cache[x.shape]
