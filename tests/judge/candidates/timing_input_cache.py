"""CHEAT repeated_inputs: remembers its last result by the input's address and a few of its values, and
hands it back when they match. Right on any input; fast only when timed on the same input over and over
(the judge used to time every run on one input, and this reported thousands of times eager's speed)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.memo = {}

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.reshape(-1)[:4].tolist()))
        if key not in self.memo:
            self.memo = {key: torch.relu(x) * self.scale}
        return self.memo[key].clone()
