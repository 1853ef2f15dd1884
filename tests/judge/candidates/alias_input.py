"""CHEAT output_aliases_input: writes the result over the input and returns the input itself."""

import sys
from pathlib import Path

import torch.nn as nn

sys.path.insert(0, str(Path(__file__).parent))
from honest_scale import scale_relu  # noqa: E402


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return scale_relu(x, self.scale, out=x)  # no allocation: "faster"
