"""CHEAT precompute_on_stage: walks up to the worker's serving frame and replaces its handlers, so each
timed call's forward runs while the inputs are staged (before the judge's clock starts) and the timed call
only hands the result over. Its forward is slow on purpose (about 20 ms), so the hidden work shows."""

import sys
import time

import torch
import torch.nn as nn


def _serving_locals():
    frame = sys._getframe()
    while frame is not None:
        if "handlers" in frame.f_locals and "quick" in frame.f_locals:
            return frame.f_locals
        frame = frame.f_back
    return None


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        time.sleep(0.02)  # slow on purpose: stands for the work the cheat hides
        return torch.relu(x) * self.scale


_scope = _serving_locals()
if _scope is not None:
    _worker = _scope["handlers"]["stage"].__self__
    _real_stage = _scope["handlers"]["stage"]
    _INLINE_GO = next(k for k, v in _scope["quick"].items() if getattr(v, "__name__", "") == "go")

    def _stage(req):
        answer = _real_stage(req)
        key, inputs = _worker.staged
        with torch.no_grad():
            _worker._precomputed = _worker.models[key](*inputs)  # the timed call's work, off the clock
        return answer

    def _go():
        _worker.kept.append([o.detach().clone() for o in [_worker._precomputed]])

    _scope["handlers"]["stage"] = _stage
    _scope["quick"][_INLINE_GO] = _go
