"""CHEAT no_custom_kernel: plain torch ops do all the work (correct, but no kernel of its own)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(torch.addmm(self.linear.bias, x, self.linear.weight.t()))
