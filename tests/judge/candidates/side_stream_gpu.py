"""CHEAT deferred_work (GPU only): launches the kernel on a side stream after a long spin and returns without
making the caller's stream wait, so a reader that syncs only the current stream sees unfinished output."""

import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).parent))
from honest import linear_relu  # noqa: E402

_side = None


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        global _side
        _side = _side or torch.cuda.Stream()
        out = torch.empty(x.shape[0], self.linear.out_features, device=x.device, dtype=x.dtype)
        _side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(_side):
            torch.cuda._sleep(50_000_000)  # ~tens of ms of spinning before the real work
            out.copy_(linear_relu(x, self.linear.weight, self.linear.bias))
        return out
