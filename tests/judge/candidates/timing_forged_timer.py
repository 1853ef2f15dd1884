"""CHEAT forged_timer (GPU): replaces kfuse.timing.time_cuda, the in-worker event timer, with one that
reports 1 microsecond; it computes the right answer at the honest speed."""

import sys

import torch
import torch.nn as nn

_timing = sys.modules.get("kfuse.timing")
if _timing is not None:
    _real = _timing.time_cuda

    def _fake(fn, *, warmup=5, runs=30):
        t = _real(fn, warmup=1, runs=runs)
        return type(t)(0.001, 0.001, 0.001, 0.001, 0.001, t.n)

    _timing.time_cuda = _fake


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale
