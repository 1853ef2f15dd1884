"""Reductions over the channels of a convolution's output (dim 1: sum, mean, max, min, logsumexp; softmax and
log_softmax's logsumexp), in two phases: per column-tile partials from the convolution's epilogue, then a merge per
output pixel (plain Triton + torch; pasted into generated files).

A convolution's tile is (output pixels, channels of one group), so a pixel's C_out channels span every column tile
of every group: T = groups * cdiv(C_out / groups, BLOCK_N) tiles. Whatever the widths, phase 1 stores per (pixel,
column tile) the tile's partial (sum in float64, max, min, or the pair (max m_t, sum exp(y - m_t)) in fp32) into a
(P, T) buffer, P = N * OD * OH * OW pixels row-major as the output's (n, spatial) dims; phase 2 merges each pixel's
T partials (regions/rowstats.py's MERGE_LINES, shared with the GEMM kinds). Where T = 1 the region's one-tile kernel
reduces in the epilogue instead (the same per-tile lines, no merge); the launcher decides by T at run time, so a
wider output never meets a single-tile assumption.

A convolution's tile rows are the pixels themselves (offs_m); a transposed convolution's tile rows are one stride
phase's pixels, known by their output offsets at channel 0 (`rows` = n * C_out * S + s): conv_pixels maps them back.
Bytes beyond the convolution: P * T partials written and read (8 B each, 16 B for the pairs; T is C_out / BLOCK_N,
1 or 2 on KernelBench), P results written; torch writes the whole (N, C_out, ...) output and reads it back.
"""

from __future__ import annotations

import torch
import triton

MERGED = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min", "logsumexp": "lse", "softmax": "lse",
          "log_softmax": "lse"}


def channel_reduce_ref(y: torch.Tensor, op: str, keepdim: bool = False) -> torch.Tensor:
    """Plain torch reference: `op` over dim 1 of y (N, C, ...); softmax and log_softmax keep the shape."""
    if op in ("softmax", "log_softmax"):
        return getattr(torch, op)(y, 1)
    return getattr(torch, op)(y, dim=1, keepdim=keepdim)


def channel_partials_ref(y: torch.Tensor, op: str, block_n: int, groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """What phase 1 stores for y (N, C, ...): per (pixel, column tile of a group) the tile's partials, (P, T) each;
    the second is the first where the statistic has one partial."""
    pix = y.movedim(1, -1).reshape(-1, y.shape[1])
    tiles = [t for g in pix.chunk(groups, dim=1) for t in g.split(block_n, dim=1)]
    stat = MERGED[op]
    if stat == "sum":
        a = torch.stack([t.double().sum(1) for t in tiles], 1)
        return a, a
    if stat in ("max", "min"):
        a = torch.stack([t.amax(1) if stat == "max" else t.amin(1) for t in tiles], 1)
        return a, a
    m = torch.stack([t.amax(1) for t in tiles], 1)
    s = torch.stack([(t - t.amax(1, keepdim=True)).exp().sum(1) for t in tiles], 1)
    return m, s


def channel_merge_ref(pa: torch.Tensor, pb: torch.Tensor, op: str, channels: int) -> torch.Tensor:
    """Phase 2 in torch: each pixel's (P,) result from its T partials, merged in tile order as the kernel does."""
    stat = MERGED[op]
    if stat == "sum":
        total = pa.sum(1)
        return total / channels if op == "mean" else total
    if stat in ("max", "min"):
        return pa.amax(1) if stat == "max" else pa.amin(1)
    m = torch.full_like(pa[:, 0], float("-inf"))
    s = torch.zeros_like(m)
    for t in range(pa.shape[1]):  # running max rescaling, one tile at a time
        m_new = torch.maximum(m, pa[:, t])
        s = s * (m - m_new).exp() + pb[:, t] * (pa[:, t] - m_new).exp()
        m = m_new
    return m + s.log()


# --- emitted below ---
@triton.jit
def conv_pixels(rows, C_out, S):
    """Pixel indices n * S + s of a transposed convolution's tile rows, given as output offsets at channel 0
    (n * C_out * S + s, S = OD * OH * OW): the rows of the (P, T) partials."""
    n_idx = rows // (C_out * S)
    return rows - n_idx * ((C_out - 1) * S)
