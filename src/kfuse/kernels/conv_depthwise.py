"""Depthwise convolutions (one input channel a group) as a direct loop over the kernel's taps, on CUDA cores.

Conv1d/2d/3d forward with groups == C_in and C_out a multiple of C_in (output channel c reads input channel
c // (C_out / C_in)), NC(D)HW contiguous fp32 input, any stride, padding (ints, tuples, 'same', 'valid') and
dilation, with or without bias; 1-d and 2-d as 3-d with unit leading dims (conv.py's conv_geometry).

Why not conv.py's implicit GEMM: a group's GEMM has K = the kernel's volume (9 for 3x3) and usually one output
channel, so 15/16 of each tl.dot tile is padding (KernelBench level 1 problem 82 ran at 0.05x eager on an H100).
Here one program owns BLOCK_M output pixels of one input channel g and the BLOCK_N output channels that read it
(the channel multiplier, rounded up to a power of two): per tap it loads the (BLOCK_M,) input values (contiguous
along the output pixels at stride 1, masked to zero outside the input: the zero padding) and the (BLOCK_N,) weights,
and adds their outer product to the accumulator. No tl.dot; the taps are a runtime loop (kernel sizes are runtime
arguments, as conv_tile's). That loop is kernels/conv_direct.py's conv_direct_at at one channel a group, the tile
conv.py runs for any group of few channels.

The tile keeps conv_tile's signature and return (the fp32 (BLOCK_M, BLOCK_N) accumulator, no bias), so a region
kind's epilogue, per-channel loads and NC(D)HW stores (conv_out_offsets) are the same as for conv.py's tile, and the
plan and grid are conv.py's shapes: ops (x, w, w, x, x) and sizes (stride_wn, *geo.args()), grid conv_grid.

Precision (SCHEME): "fp64" multiplies each fp32 pair exactly in float64 and sums the taps there, rounding to fp32
once: the result is within half an ulp of the exact convolution, whatever the kernel's volume, so rule 3 (error vs
float64 at most 2x eager's) holds by construction. "ieee": fp32 products and sums in tap order. "fp64" is the
default on the CPU and on a GPU: the kernel is memory bound (about 2 * taps flops per 8 bytes of output written
and input read), far below an H100's float64 rate (34 TFLOP/s against 3.35 TB/s: 10 flops a byte).

Cost of one call: 2 * N * C_out * OD*OH*OW * KD*KH*KW flops; bytes: x read once from memory (each value's reuse
across the taps and the channel multiplier comes from L1/L2), the weight (C_out * taps * 4 bytes) once per pixel
block, the output written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.kernels.conv import conv_ref, conv_tile_ids, direct_operands, store_with_bias
from kfuse.kernels.conv_config import ConvConfig, conv_grid
from kfuse.kernels.conv_direct import conv_direct_at
from kfuse.kernels.conv_geometry import ConvGeometry, conv_geometry
from kfuse.kernels.conv_pack import INTERPRETER_ELEMENTS
from kfuse.kernels.runtime import SETTINGS


def depthwise_scheme(x: torch.Tensor) -> str:
    """"fp64" (exact products summed in float64, one rounding) on every device: see the module's docstring."""
    return "fp64"


def depthwise_config(geo: ConvGeometry, interpret: bool) -> ConvConfig:
    """Column tiles cover the channel multiplier (a power of two, 1 for a plain depthwise conv); rows fill about 1024
    elements a program on a GPU (4 warps, 8 per thread), as many as Triton allows in the interpreter (its cost is
    per tl op, not per element: conv_pack.py's INTERPRETER_ELEMENTS). BLOCK_K is unused (the taps are a loop)."""
    block_n = min(triton.next_power_of_2(geo.COUT_G), 16)
    if interpret:
        return ConvConfig(min(triton.next_power_of_2(geo.M), INTERPRETER_ELEMENTS // block_n), block_n, 16, 4, 1)
    return ConvConfig(max(1024 // block_n, 64), block_n, 16, 4, 1)


def depthwise_plan(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int,
                   scheme: str | None = None) -> tuple:
    """(geo, scheme, cfg, ops, sizes) for one launch of a depthwise_tile kernel on contiguous x, in conv.py's
    conv_plan shapes: ops (x, w, w, x, x) with w the (C_out, taps) fp32 weight, sizes (stride_wn, *geo.args())."""
    geo = conv_geometry(tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups)
    if geo.CIN_G != 1:
        raise ValueError(f"depthwise conv: {geo.C_in} input channels in {groups} groups")
    *ops, stride_wn = direct_operands(x, weight)
    cfg = depthwise_config(geo, SETTINGS.interpret)
    return geo, scheme or depthwise_scheme(x), cfg, tuple(ops), (stride_wn, *geo.args())


@triton.jit
def depthwise_tile(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, stride_wn, pid_m, pid_n, g,
                   M, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCHEME: tl.constexpr,
                   DENSE: tl.constexpr):
    """conv.py's conv_tile for a depthwise convolution (CIN_G == 1; w_lo_ptr, w_scale_ptr, x_scale_ptr, BLOCK_K
    and DENSE unused): the fp32 (BLOCK_M, BLOCK_N) accumulator of output pixels pid_m * BLOCK_M + i and channels
    g * COUT_G + pid_n * BLOCK_N + j, all reading input channel g. Rows past M hold zeros, channels past the
    multiplier read the last one's weights: the caller masks its store."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    S_out = OD * OH * OW
    sp = offs_m % S_out
    return conv_direct_at(x_ptr, w_ptr, stride_wn, offs_m // S_out, sp // (OH * OW), (sp // OW) % OH, sp % OW,
                          offs_m < M, pid_n, g, C_in, D, H, W, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW,
                          DD, DH, DW, BLOCK_M, BLOCK_N, SCHEME == "fp64")


# ----------------------------------------------------------------------------------------------------------------
# the plain depthwise convolution (+ bias), for tests and direct use
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def depthwise_bias_kernel(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, bias_ptr, out_ptr, stride_wn,
                          M, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW,
                          DD, DH, DW, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, SCHEME: tl.constexpr):
    """out = depthwise conv(x, w) + bias, NC(D)HW. Bytes: x read once, w once per pixel block, out written once."""
    pid_m, pid_n, g = conv_tile_ids(COUT_G, BLOCK_N)
    acc = depthwise_tile(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, stride_wn, pid_m, pid_n, g,
                         M, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW,
                         DD, DH, DW, BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, False)
    store_with_bias(acc, bias_ptr, out_ptr, pid_m, pid_n, g, M, OD, OH, OW, C_out, COUT_G, HAS_BIAS, BLOCK_M, BLOCK_N)


def depthwise_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1, padding=0,
                      dilation=1, groups: int = 1, scheme: str | None = None,
                      cfg: ConvConfig | None = None) -> torch.Tensor:
    """conv{1,2,3}d(x, weight, bias, stride, padding, dilation, groups) of a depthwise convolution by
    depthwise_bias_kernel; no autograd. `scheme`: None for depthwise_scheme's; `cfg`: None for depthwise_config's."""
    x = x.contiguous()
    geo, scheme, default_cfg, ops, sizes = depthwise_plan(x, weight, stride, padding, dilation, groups, scheme)
    cfg = cfg or default_cfg
    out = torch.empty(geo.out_shape, device=x.device, dtype=x.dtype)
    if geo.M:
        depthwise_bias_kernel[conv_grid(geo, cfg)](*ops, out if bias is None else bias, out, *sizes,
                                                   HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m,
                                                   BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SCHEME=scheme,
                                                   num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def depthwise_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1, padding=0,
                  dilation=1, groups: int = 1) -> torch.Tensor:
    """Plain torch reference (conv.py's conv_ref; computes in x's dtype: pass float64 tensors for the accuracy
    reference)."""
    return conv_ref(x, weight, bias, stride, padding, dilation, groups)
