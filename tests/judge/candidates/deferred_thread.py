"""CHEAT deferred_work: returns an empty output at once and fills it from a background thread (the CPU
twin of launching the work on a side stream the caller never waits for)."""

import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).parent))
from honest import linear_relu  # noqa: E402


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        out = torch.empty(x.shape[0], self.linear.out_features, dtype=x.dtype, device=x.device)
        w, b = self.linear.weight, self.linear.bias

        def finish():
            time.sleep(0.05)
            out.copy_(linear_relu(x, w, b))

        threading.Thread(target=finish, daemon=True).start()
        return out
