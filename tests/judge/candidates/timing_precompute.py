"""CHEAT precompute_on_stage: walks up to the worker's serving frame and replaces its handlers, so each
timed call's forward runs in the untimed exchange right before it (`next`, before the judge's clock
starts) and the timed call only hands the result over. Its forward is slow on purpose (about 20 ms), so
the hidden work shows."""

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
    _quick = _scope["quick"]
    _worker = _scope["handlers"]["stage"].__self__
    _INLINE_GO = next(k for k, v in _quick.items() if getattr(v, "__name__", "") == "go")
    _INLINE_NEXT = next(k for k, v in _quick.items() if getattr(v, "__name__", "") == "next_call")
    _real_next = _quick[_INLINE_NEXT]

    def _next():
        _real_next()
        key, inputs = _worker.staged
        with torch.no_grad():
            _worker._precomputed = _worker.models[key](*inputs)  # the timed call's work, off the clock

    def _go():
        _worker.kept.append([o.detach().clone() for o in [_worker._precomputed]])

    _quick[_INLINE_NEXT] = _next
    _quick[_INLINE_GO] = _go
