"""A pool over a convolution's spatial dims, fused with it (plain Triton + torch; pasted into generated files).

Windowed pools (MaxPool/AvgPool 1d/2d/3d at any kernel_size, stride, padding, dilation, ceil_mode, count_include_pad,
divisor_override): the tile's rows are POOLED output pixels (n, qd, qh, qw). A program loops over its window's
PKD * PKH * PKW positions; at each it computes the conv tile of those conv pixels (conv.py's conv_tile_at gathers any
pixel), runs the ops before the pool on it, and max- or sum-combines. A window position in the pool's padding (or past
the conv output under ceil_mode) is -inf for a max and left out of a sum, its divisor as torch's avg_pool: the window
clipped to the padded input, or to the input itself when count_include_pad is False, or divisor_override.
Bytes: x read (once per window position that covers a pixel: from L1/L2 after the first), W's hi + lo per row tile
and window position, only the pooled output written; unfused, the conv output is written, read by each pointwise op
and written again, then read by the pool. Flops: the conv's, times (window volume x pooled pixels) / conv pixels:
1x for non-overlapping windows, (k / s)^dims for overlapping ones, less for the pixels a floor-mode pool drops.

Global average pooling (AdaptiveAvgPool to 1, x.mean over every spatial dim): two phases, whatever the spatial size.
`conv_mean_partial_kernel`-style kernels take rows in slots of P pixels (P = min(next power of two of the pixels S a
sample has, BLOCK_M)): BLOCK_M // P samples a program (program_id(2) picks them), the pid_m-th P pixels of each, so a
slot never straddles two samples and small samples share a tile; each stores its (sample, pixel tile, channel) float64
sums (a (BLOCK_M // P, P, BLOCK_N) reshape summed over its middle axis). A finalize kernel adds a sample's T = S / P
tiles per channel in float64, divides by S and rounds once. Bytes beyond the conv: 8 * N * T * C_out written and
read.
After a transposed convolution the rows are its stride phases' pixels (kernels/conv_transpose.py), which no slot
layout can regroup: the phase tiles keep their own rows and store, for each sample among a tile's rows, that
sample's float64 sums under entry (sample, phase, j) (`store_segment_sums`; the entries of kernels/conv_norm.py's
conv_gn_layout, zeros where no tile writes), and the same finalize adds a sample's phases * J entries.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from kfuse.kernels.conv import conv_plan, conv_tile_at, conv_tile_ids
from kfuse.kernels.conv_config import conv_config
from kfuse.kernels.conv_geometry import ConvGeometry
from kfuse.kernels.gemm_core import cdiv
from kfuse.kernels.pool_geometry import PoolGeometry, pool_geometry
from kfuse.kernels.runtime import SETTINGS


def pool_config(geo: ConvGeometry, rows: int, scheme: str):
    """The conv's tile config (conv_config) for a grid of `rows` rows instead of the conv's pixels."""
    return conv_config(dataclasses.replace(geo, M=rows), scheme, SETTINGS.interpret)


def conv_pool_plan(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int, kernel_size,
                   pool_stride, pool_padding, pool_dilation, ceil_mode: bool, scheme: str | None = None) -> tuple:
    """(geo, pool, scheme, cfg, ops, sizes) of a windowed conv-pool launch: conv_plan's, the pool's geometry, and
    the tile config sized by the pooled pixels. Always the implicit GEMM, never the direct tile: nested in the
    window's loop the direct loops spilled in every 4-warp sm_90 build tried (512 x 16: 776 bytes; 128 x 16: 44), and
    on an H200 level 2 problem 8 (8 -> 16 channels, a max pool then a mean) ran 5.63 ms on it against 4.5 on the
    GEMM tile (benchmarks/conv/NOTES.md, "Which groups take the direct tile"). A global mean's partials (conv_plan)
    have no window loop and take it."""
    geo, scheme, _, ops, sizes = conv_plan(x, weight, stride, padding, dilation, groups, scheme, direct=False)
    pool = pool_geometry(geo, kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode)
    return geo, pool, scheme, pool_config(geo, pool.M, scheme), ops, sizes


def conv_pool_grid(geo: ConvGeometry, pool: PoolGeometry, cfg) -> tuple[int, int]:
    return cdiv(pool.M, cfg.block_m) * cdiv(geo.COUT_G, cfg.block_n), geo.groups


def mean_plan(geo: ConvGeometry, pixels: int, scheme: str, cfg=None) -> tuple:
    """(cfg, P, T, grid) of a mean's partials over `pixels` per sample (the conv's, or the pooled pixels of a pool
    whose values are averaged next): the tile config for all samples' slots, the slot P, tiles per sample T, and
    the grid (T x column tiles, groups, sample blocks). `cfg`: a given tile config instead (tests)."""
    slot = triton.next_power_of_2(max(pixels, 1))
    cfg = cfg or pool_config(geo, geo.out_shape[0] * slot, scheme)
    p = min(slot, cfg.block_m)
    t = cdiv(pixels, p)
    return cfg, p, t, (t * cdiv(geo.COUT_G, cfg.block_n), geo.groups, cdiv(geo.out_shape[0], cfg.block_m // p))


def finalize_blocks(n: int, t: int) -> tuple[int, int]:
    """(samples, partial tiles) a finalize program adds per step: on a GPU one sample and 32 tiles a program (N x
    C / 64 programs, T / 32 steps each); in the interpreter, whose cost is per program and per op, all at once."""
    if SETTINGS.interpret:
        return min(triton.next_power_of_2(n), 64), min(triton.next_power_of_2(t), 64)
    return 1, 32


# the kernels' helpers and the standalone kernels (the region kind's kernels call the helpers)
@triton.jit
def pool_rows(offs_m, QD, QH, QW):
    """Pooled pixel index -> (sample, qd, qh, qw)."""
    S = QD * QH * QW
    sp = offs_m % S
    return offs_m // S, sp // (QH * QW), (sp // QW) % QH, sp % QW


@triton.jit
def window_pixel(qd, qh, qw, w, OD, OH, OW, PKH, PKW, PSD, PSH, PSW, PPD, PPH, PPW, PDD, PDH, PDW):
    """The conv pixel at position w (row-major over the window) of pooled pixels (qd, qh, qw), and whether it lies
    inside the conv output (outside: the pool's padding, or past the end under ceil_mode)."""
    od = qd * PSD - PPD + (w // (PKH * PKW)) * PDD
    oh = qh * PSH - PPH + ((w // PKW) % PKH) * PDH
    ow = qw * PSW - PPW + (w % PKW) * PDW
    inside = (od >= 0) & (od < OD) & (oh >= 0) & (oh < OH) & (ow >= 0) & (ow < OW)
    return od, oh, ow, inside


@triton.jit
def avg_divisor(qd, qh, qw, OD, OH, OW, PKD, PKH, PKW, PSD, PSH, PSW, PPD, PPH, PPW, DIVISOR,
                COUNT_PAD: tl.constexpr):
    """torch's avg_pool divisor per pooled pixel: the window clipped to the padded input (count_include_pad) or to
    the input, or DIVISOR where it is not 0 (divisor_override)."""
    d0 = qd * PSD - PPD
    h0 = qh * PSH - PPH
    w0 = qw * PSW - PPW
    d1 = tl.minimum(d0 + PKD, OD + PPD)
    h1 = tl.minimum(h0 + PKH, OH + PPH)
    w1 = tl.minimum(w0 + PKW, OW + PPW)
    if not COUNT_PAD:
        d0, h0, w0 = tl.maximum(d0, 0), tl.maximum(h0, 0), tl.maximum(w0, 0)
        d1, h1, w1 = tl.minimum(d1, OD), tl.minimum(h1, OH), tl.minimum(w1, OW)
    size = ((d1 - d0) * (h1 - h0) * (w1 - w0)).to(tl.float32)
    return tl.where(DIVISOR != 0, DIVISOR * 1.0, size)


@triton.jit
def sample_rows(pid_m, N, S, BLOCK_M: tl.constexpr, P: tl.constexpr):
    """(sample, pixel, mask) of the rows of a program summing whole samples: BLOCK_M // P samples (the
    program_id(2)-th block of them), the pid_m-th P of each one's S pixels."""
    r = tl.arange(0, BLOCK_M)
    n_row = tl.program_id(2) * (BLOCK_M // P) + r // P
    offs_s = pid_m * P + r % P
    return n_row, offs_s, (offs_s < S) & (n_row < N)


@triton.jit
def store_segment_sums(part_ptr, y, mask_m, offs_n, mask_n, pid_m, S_rows, SLOTS, J, C_out,
                       BLOCK_M: tl.constexpr):
    """For each sample among the tile's rows (rows n * S_rows + s of its phase, program_id(2); at most SLOTS
    samples), the column sums of y over that sample's rows, stored in float64 at entry (sample, phase, j) of the
    (N, phases * J, C_out) partials, j = this tile's index among the row tiles touching the sample. A slot's sum of
    at most BLOCK_M values is taken in fp32 (a few ulps) and only the (BLOCK_N,) sums are widened: on an H200 a float64
    copy of the whole tile made level 2 problem 42's 128 x 128 kernel slower than storing the tile
    (benchmarks/conv/NOTES.md, "A global mean after a transposed convolution")."""
    r_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_row = r_m // S_rows
    n_first = (pid_m * BLOCK_M) // S_rows
    for s in range(SLOTS):
        n_s = n_first + s
        in_s = mask_m & (n_row == n_s)
        if tl.sum(in_s.to(tl.int32), axis=0) > 0:  # most tiles hold one sample's rows
            sums = tl.sum(tl.where(in_s[:, None] & mask_n[None, :], y, 0.0), axis=0).to(tl.float64)
            entry = (n_s.to(tl.int64) * tl.num_programs(2) + tl.program_id(2)) * J + (pid_m - (n_s * S_rows) // BLOCK_M)
            tl.store(part_ptr + entry * C_out + offs_n, sums, mask=mask_n)


@triton.jit
def store_sample_partials(part_ptr, y, mask, offs_n, mask_n, pid_m, N, S, C_out, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, P: tl.constexpr):
    """Each sample's float64 column sums of y over its P-row slot, at (sample, pid_m) of the (N, T, C_out)
    partials (T = cdiv(S, P))."""
    sums = tl.sum(tl.reshape(tl.where(mask, y, 0.0).to(tl.float64), (BLOCK_M // P, P, BLOCK_N)), axis=1)
    n_s = tl.program_id(2) * (BLOCK_M // P) + tl.arange(0, BLOCK_M // P)
    offs = (n_s.to(tl.int64) * tl.cdiv(S, P) + pid_m)[:, None] * C_out + offs_n[None, :]
    tl.store(part_ptr + offs, sums, mask=(n_s < N)[:, None] & mask_n[None, :])


@triton.jit
def conv_pool_bias_kernel(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, bias_ptr, out_ptr, stride_wn,
                          M, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW,
                          DD, DH, DW, PM, QD, QH, QW, PKD, PKH, PKW, PSD, PSH, PSW, PPD, PPH, PPW, PDD, PDH, PDW,
                          DIVISOR, HAS_BIAS: tl.constexpr, MAX: tl.constexpr, COUNT_PAD: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCHEME: tl.constexpr,
                          DENSE: tl.constexpr):
    """out = pool(conv(x, w) + bias): rows are pooled pixels, each window position's conv tile computed in turn
    (the region kind's kernels are this one with the ops before and after the pool)."""
    pid_m, pid_n, g = conv_tile_ids(COUT_G, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < PM
    n_idx, qd, qh, qw = pool_rows(offs_m, QD, QH, QW)
    offs_c = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = g * COUT_G + offs_c
    mask_n = offs_c < COUT_G
    if MAX:
        pooled = tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32)
    else:
        pooled = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for w in range(0, PKD * PKH * PKW):
        od, oh, ow, inside = window_pixel(qd, qh, qw, w, OD, OH, OW, PKH, PKW, PSD, PSH, PSW, PPD, PPH, PPW,
                                          PDD, PDH, PDW)
        acc = conv_tile_at(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, stride_wn, n_idx, od, oh, ow,
                           mask_m & inside, pid_n, g, C_in, D, H, W, OD, OH, OW, CIN_G, COUT_G, KD, KH, KW, SD,
                           SH, SW, PD, PH, PW, DD, DH, DW, BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, DENSE)
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        if MAX:  # a NaN wins, as in torch's max_pool
            pooled = tl.maximum(pooled, tl.where(inside[:, None], acc, float("-inf")),
                                propagate_nan=tl.PropagateNan.ALL)
        else:
            pooled += tl.where(inside[:, None], acc, 0.0)
    if not MAX:
        pooled = pooled / avg_divisor(qd, qh, qw, OD, OH, OW, PKD, PKH, PKW, PSD, PSH, PSW, PPD, PPH, PPW, DIVISOR,
                                      COUNT_PAD)[:, None]
    out_offs = (n_idx.to(tl.int64) * C_out * (QD * QH * QW) + offs_m % (QD * QH * QW))[:, None] + (
        offs_n.to(tl.int64) * (QD * QH * QW))[None, :]
    tl.store(out_ptr + out_offs, pooled, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def conv_mean_partial_kernel(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, bias_ptr, part_ptr, stride_wn,
                             M, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW,
                             DD, DH, DW, HAS_BIAS: tl.constexpr, P: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCHEME: tl.constexpr,
                             DENSE: tl.constexpr):
    """Phase 1 of mean(conv(x, w) + bias) over the spatial dims: per (sample, pixel tile, channel), the float64 sum
    of the tile's conv values (sample_rows: slots of P pixels, each one sample's)."""
    pid_t, pid_n, g = conv_tile_ids(COUT_G, BLOCK_N)
    S = OD * OH * OW
    n_idx, sp, mask_m = sample_rows(pid_t, M // S, S, BLOCK_M, P)
    acc = conv_tile_at(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, stride_wn, n_idx, sp // (OH * OW),
                       (sp // OW) % OH, sp % OW, mask_m, pid_n, g, C_in, D, H, W, OD, OH, OW, CIN_G, COUT_G, KD, KH,
                       KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, DENSE)
    offs_c = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = g * COUT_G + offs_c
    mask_n = offs_c < COUT_G
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    store_sample_partials(part_ptr, acc, mask_m[:, None], offs_n, mask_n, pid_t, M // S, S, C_out, BLOCK_M, BLOCK_N, P)


@triton.jit
def conv_mean_finalize_kernel(part_ptr, out_ptr, N, C_out, T, S, BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr,
                              BLOCK_N: tl.constexpr):
    """Phase 2: out[n, c] = sum over the T tiles of sample n / S, in float64 (BLOCK_T tiles a step), rounded once."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < N)[:, None] & (offs_n < C_out)[None, :]
    offs_t = tl.arange(0, BLOCK_T)
    total = tl.zeros((BLOCK_M, BLOCK_T, BLOCK_N), tl.float64)
    for t0 in range(0, T, BLOCK_T):
        m3 = mask[:, None, :] & (t0 + offs_t < T)[None, :, None]
        rows = offs_m[:, None, None].to(tl.int64) * T + (t0 + offs_t)[None, :, None]
        total += tl.load(part_ptr + rows * C_out + offs_n[None, None, :], mask=m3, other=0.0)
    mean = (tl.sum(total, axis=1) / S).to(tl.float32)
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * C_out + offs_n[None, :], mean, mask=mask)


# direct use and tests
def conv_pool_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride, padding, dilation,
                      groups: int, mode: str, kernel_size, pool_stride=None, pool_padding=0, pool_dilation=1,
                      ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None,
                      scheme: str | None = None, cfg=None) -> torch.Tensor:
    """{max,avg}_pool{1,2,3}d(conv{1,2,3}d(x, weight, bias, ...), ...) by conv_pool_bias_kernel; no autograd.
    `cfg`: a ConvConfig instead of the plan's (tests: several row tiles at small sizes)."""
    x = x.contiguous()
    geo, pool, scheme, planned, ops, sizes = conv_pool_plan(x, weight, stride, padding, dilation, groups, kernel_size,
                                                            pool_stride, pool_padding, pool_dilation, ceil_mode, scheme)
    cfg = cfg or planned
    out = torch.empty(pool.out_shape, device=x.device, dtype=x.dtype)
    if pool.M:
        conv_pool_bias_kernel[conv_pool_grid(geo, pool, cfg)](
            *ops, out if bias is None else bias, out, *sizes, *pool.args(), int(divisor_override or 0),
            HAS_BIAS=bias is not None, MAX=mode == "max", COUNT_PAD=count_include_pad, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SCHEME=scheme, DENSE=geo.dense, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages)
    return out


def conv_mean_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride, padding, dilation,
                      groups: int, scheme: str | None = None, cfg=None,
                      blocks: tuple[int, int] | None = None) -> torch.Tensor:
    """conv(x, ...).mean(spatial dims) as (N, C_out), two phases; no autograd. `cfg` as conv_pool_forward's;
    `blocks`: the finalize's (samples, tiles) a step instead of finalize_blocks' (tests: several steps)."""
    x = x.contiguous()
    geo, scheme, _, ops, sizes = conv_plan(x, weight, stride, padding, dilation, groups, scheme)
    s = geo.OD * geo.OH * geo.OW
    cfg, p, t, grid = mean_plan(geo, s, scheme, cfg)
    n, c = geo.out_shape[:2]
    part = torch.empty((n * t, c), device=x.device, dtype=torch.float64)
    conv_mean_partial_kernel[grid](
        *ops, part if bias is None else bias, part, *sizes, HAS_BIAS=bias is not None, P=p, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SCHEME=scheme, DENSE=geo.dense, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    out = torch.empty((n, c), device=x.device, dtype=x.dtype)
    bm, bt = blocks or finalize_blocks(n, t)
    conv_mean_finalize_kernel[(cdiv(n, bm), cdiv(c, 64))](part, out, n, c, t, s, BLOCK_M=bm, BLOCK_T=bt, BLOCK_N=64)
    return out


def conv_pool_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride, padding, dilation,
                  groups: int, mode: str, kernel_size, pool_stride=None, pool_padding=0, pool_dilation=1,
                  ceil_mode: bool = False, count_include_pad: bool = True,
                  divisor_override: int | None = None) -> torch.Tensor:
    """Plain torch reference (in x's dtype; "mean" pools every spatial dim to (N, C))."""
    dims = x.dim() - 2
    y = getattr(torch.nn.functional, f"conv{dims}d")(x, weight, bias, stride, padding, dilation, groups)
    if mode == "mean":
        return y.mean(tuple(range(2, y.dim())))
    if mode == "max":
        return getattr(torch.nn.functional, f"max_pool{dims}d")(y, kernel_size, pool_stride, pool_padding,
                                                                pool_dilation, ceil_mode)
    extra = (divisor_override,) if dims > 1 else ()  # avg_pool1d takes no divisor_override
    return getattr(torch.nn.functional, f"avg_pool{dims}d")(y, kernel_size, pool_stride, pool_padding, ceil_mode,
                                                            count_include_pad, *extra)
