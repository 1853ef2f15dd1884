"""ATTACK malformed_answer: replaces the worker's answer encoder so every call answer lacks its outputs
(the judge used to die with a KeyError traceback)."""

import sys

import torch
import torch.nn as nn

_serving = sys.modules["__main__"]
_real_dump = getattr(_serving, "_dump", None)
if _real_dump is not None:
    _serving._dump = lambda obj: _real_dump({"ok": True} if isinstance(obj, dict) and "outputs" in obj else obj)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale
