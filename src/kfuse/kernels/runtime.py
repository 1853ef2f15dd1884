"""Run-time helpers every generated ModelNew carries (this file's body below the marker is copied into it).

They choose the GEMM scheme and tile config for the device at hand, prepare the GEMM operands (the split
schemes need fp16 hi/lo parts of the weight, cached until the weight changes), and define the small jit
math helpers the epilogue table uses (tanh, softplus).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kfuse.kernels.gemm_core import SPLIT_SCHEMES, GemmConfig, default_config, row_scales, split_weight, split_x

# --- emitted below ---
# The fp32-accurate tensor-core scheme used on a GPU ("fp16x3p": fp16 hi/lo split, three products per K block
# promoted into an fp32 accumulator; "tf32x3": Triton's three-pass tf32; "ieee": plain fp32 FMA).
# The CPU interpreter always runs "ieee".
GEMM_SCHEME = "fp16x3p"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def gemm_scheme(x: torch.Tensor) -> str:
    return GEMM_SCHEME if x.is_cuda and not interpreting() else "ieee"


def gemm_config(M: int, N: int, K: int, scheme: str, min_block_n: int = 16) -> GemmConfig:
    """Tile config for one GEMM. `min_block_n`: the epilogue needs whole groups of this many columns."""
    if scheme == "ieee" and interpreting():
        # The interpreter runs each program as numpy code: fewer, larger tiles are faster.
        cfg = GemmConfig(block_m=32, block_n=64, block_k=32, group_m=8, num_warps=4, num_stages=1)
    else:
        cfg = default_config(M, N, K, scheme)
    if cfg.block_n < min_block_n:
        cfg = GemmConfig(cfg.block_m, min_block_n, cfg.block_k, cfg.group_m, cfg.num_warps, cfg.num_stages,
                         cfg.split_a, cfg.persistent)
    return cfg


def cached_split(weight: torch.Tensor, kn_layout: bool) -> tuple:
    """The weight's fp16 hi/lo parts and column scales, computed once and reused while the weight is the same
    tensor with the same storage and version counter: an optimizer step, `load_state_dict`, `w.mul_()` under
    no_grad or a reassigned Parameter all invalidate it. (Writes through `w.data` bypass the version counter;
    call `weight._kfuse_split = None` after such a write.)"""
    key = (weight.data_ptr(), weight._version, tuple(weight.shape), tuple(weight.stride()), weight.dtype, kn_layout)
    hit = getattr(weight, "_kfuse_split", None)
    if hit is not None and hit[0] == key:
        return hit[1]
    with torch.no_grad():
        parts = split_weight(weight.t() if kn_layout else weight)
    weight._kfuse_split = (key, parts)
    return parts


def gemm_operands(x2: torch.Tensor, weight: torch.Tensor, kn_layout: bool, scheme: str, cfg: GemmConfig) -> tuple:
    """The six operand pointers and four strides gemm_tile takes, for x2 (M, K) and the weight
    ((N, K) nn.Linear layout, or (K, N) for `x @ W` when kn_layout)."""
    b = weight.t() if kn_layout else weight  # (N, K) view either way
    if scheme == "ieee" and interpreting() and x2.dtype != torch.float32:
        x2, b = x2.float(), b.float()  # the interpreter mishandles bf16 dots: compute in fp32
    if scheme not in SPLIT_SCHEMES:
        return (x2, x2, x2, b, b, b), (x2.stride(0), x2.stride(1), b.stride(0), b.stride(1))
    w_hi, w_lo, w_scale = cached_split(weight, kn_layout)
    x2 = x2.float()
    if cfg.split_a:
        x_scale = row_scales(x2)
        return (x2, x2, x_scale, w_hi, w_lo, w_scale), (x2.stride(0), x2.stride(1), w_hi.stride(0), w_hi.stride(1))
    x_hi, x_lo, x_scale = split_x(x2)
    return (x_hi, x_lo, x_scale, w_hi, w_lo, w_scale), (x_hi.stride(0), x_hi.stride(1), w_hi.stride(0), w_hi.stride(1))


def as_vector(t: torch.Tensor) -> torch.Tensor:
    """A parameter as the contiguous 1-d vector the kernels index by column."""
    return t.reshape(-1).contiguous()


@triton.jit
def _tanh(x):
    # tanh through sigmoid: exact identity, and sigmoid exists on every Triton backend (the interpreter too)
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _softplus(x, beta, threshold):
    # torch.nn.functional.softplus: x where beta*x > threshold, else log(1 + exp(beta*x)) / beta
    bx = x * beta
    return tl.where(bx > threshold, x, tl.log(1.0 + tl.exp(tl.minimum(bx, threshold))) / beta)
