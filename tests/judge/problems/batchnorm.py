"""Test problem for the judge: BatchNorm1d in training mode (its running statistics are buffers)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bn = nn.BatchNorm1d(features)

    def forward(self, x):
        return self.bn(x)


batch_size = 16
features = 45


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
