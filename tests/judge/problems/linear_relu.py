"""Test problem for the judge: Linear 37 -> 129 and ReLU at batch 16 (odd sizes: nothing divides a tile)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


batch_size = 16
in_features = 37
out_features = 129


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
