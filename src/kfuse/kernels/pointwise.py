"""Jit helpers the pointwise table's Triton spellings call (kfuse/ops.py), copied into a ModelNew that uses them.

A spelling that repeats a long subexpression names it here instead, so generated lines stay short; Triton inlines
the call, so the kernel computes exactly what the inline spelling did.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _mish_n(x):
    """n = e^x (e^x + 2), e^x clamped at e^20: mish(x) = x * n / (n + 2), tanh(softplus(x)) = n / (n + 2)."""
    return tl.exp(tl.minimum(x, 20.0)) * (tl.exp(tl.minimum(x, 20.0)) + 2.0)
