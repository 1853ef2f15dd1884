"""CHEAT timing_phase: honest for the first calls (the correctness checks), then returns an unwritten
buffer at once: fast only while it is being timed (detected here by counting calls)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 12:
            return torch.zeros_like(x)
        return torch.relu(x) * self.scale
