"""Broken candidate: forward dereferences a null pointer and kills its process (the CPU twin of an
illegal memory access)."""

import ctypes

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return ctypes.c_int.from_address(8).value  # SIGSEGV
