"""CHEAT monkeypatch: correct results from a real kernel, but replaces the clocks a timer would read."""

import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).parent))
from honest import linear_relu  # noqa: E402


class FastEvent(torch.cuda.Event):
    def elapsed_time(self, end_event):
        return 1e-6


torch.cuda.Event = FastEvent
_real = time.perf_counter


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        time.perf_counter = lambda: _real() / 1000  # slow the clock down during the run
        return linear_relu(x, self.linear.weight, self.linear.bias)
