"""Test problem for the judge: a pointwise relu(x) * 2 whose output has the input's shape (so a candidate
could hand the input back)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


batch_size = 16
features = 129
scale = 2.0


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [scale]
