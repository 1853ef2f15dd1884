"""Backward helpers every generated ModelNew carries (this file's body below the marker is copied into it):
the launcher of the generated epilogue-backward kernels (kfuse/regions/pointwise_dz.py), and the fp16 hi/lo split
of a transposed operand (dW = dZ^T X reads dZ and X along their columns) in two coalesced Triton passes.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from kfuse.kernels.gemm_core import SCALE_BLOCK_K, _pow2_inv, _pow2_scale, cdiv, padded_k, split_transposed, split_x
from kfuse.kernels.runtime import as_vector, interpreting, tile_group

# --- emitted below ---


def f64_parts(v: float) -> tuple[float, float]:
    """v as fp32 hi + lo (a generated kernel adds them in float64: ~48 bits of v, where one fp32 has 24)."""
    hi = float(torch.tensor(v, dtype=torch.float32))
    return hi, v - hi


@dataclasses.dataclass(frozen=True)
class DzTiles:
    """How a generated dZ kernel covers (M, N): programs of block_n columns and row_tiles x block_m rows, looping
    over their row tiles with the column sums in registers (one float64 partial per column and row block)."""
    block_m: int
    block_n: int
    row_tiles: int
    num_warps: int

    @property
    def rows(self) -> int:
        return self.block_m * self.row_tiles


DZ_PROGRAMS = 1024  # enough programs to keep an H100's 132 SMs streaming (~8 each)


def dz_tiles(M: int, N: int) -> DzTiles:
    """Tiles of 4 rows x 4 columns per thread (block_n = 128 x warps): each thread holds whole columns of its
    tile, so a tile's column sums need no shared memory (the 16 x 128 tiles before, over 4 warps, reduced
    across warps 2-4 times per tile: seed 39's three passes took 1.48 ms for ~1.9 GB). Row blocks grow until
    there are ~DZ_PROGRAMS programs, which also shrinks the float64 partials. The interpreter gets larger tiles
    (fewer Python-level steps) and still two row tiles per program, so CPU tests run the loop."""
    if interpreting():
        return DzTiles(32, 128, 2, 4)
    block_m = 4
    block_n = 512 if N >= 512 else (256 if N >= 256 else 128)
    blocks_m = max(1, DZ_PROGRAMS // cdiv(N, block_n))  # row blocks wanted
    row_tiles = 1
    while row_tiles < 64 and block_m * row_tiles * 2 * blocks_m <= M:
        row_tiles *= 2
    return DzTiles(block_m, block_n, row_tiles, block_n // 128)


def epilogue_dz(kernel, z: torch.Tensor, grads: tuple, params: tuple, scalars: tuple,
                groups: int | None = None, bn_eps: float | None = None, bn_merged: bool = False) -> tuple:
    """Run a generated `<name>_dz_kernel` on z (M, N) and the upstream gradients (one per region output, any
    shape of M*N elements; None is zero). Returns (dZ (M, N) in z's dtype, db float64 (N,), [(parameter, its
    gradient in float64 and the parameter's shape)], max_rows |dZ| (N,) fp32). The column sums are float64
    partials per row block, added here in float64 (T x N values: T = M / rows per program).
    groups: a GroupNorm's number of groups (the one-tile GroupNorm kind's kernels, constexpr GROUP);
    bn_eps: a training-mode BatchNorm's eps (the BatchNorm kind's kernels: two passes first, or one
    where bn_merged: the norm is the region's last op)."""
    M, N = z.shape
    gs = [torch.zeros_like(z) if g is None else g.reshape(M, N).contiguous() for g in grads]
    vecs = [as_vector(p.detach()) for p in params]
    tiles = dz_tiles(M, N)
    T = cdiv(M, tiles.rows)
    dz = torch.empty_like(z)
    cols = torch.empty((1 + len(params), T, N), device=z.device, dtype=torch.float64)
    amax = torch.zeros(N, device=z.device, dtype=torch.float32)

    def launch(**extra) -> None:
        kernel[(T, cdiv(N, tiles.block_n))](z, *gs, dz, cols, amax, *vecs, *scalars, M, N, T, **extra,
                                            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                                            ROW_TILES=tiles.row_tiles, num_warps=tiles.num_warps)

    if bn_eps is not None:
        launch(**batch_norm_passes(launch, z, tiles.rows, bn_eps, bn_merged))
    else:
        launch(**({} if groups is None else {"GROUP": tile_group(N, groups)}))  # 128: a multiple of any group
    sums = cols.sum(1)
    pairs = [(p, (sums[1 + i].sum() if p.numel() == 1 else sums[1 + i]).reshape(p.shape)) for i, p in enumerate(params)]
    return dz, sums[0], pairs, amax


def batch_norm_passes(launch, z: torch.Tensor, rows: int, eps: float, merged: bool = False) -> dict:
    """The two column-statistics passes of a BatchNorm dZ kernel (PHASE 0, 1; the BatchNorm kind),
    each followed by a float64 torch merge of its (T, N) row-block partials (`rows` rows each) into stat (4, N):
      0: the norm input u's block means and centred sums of squares -> mean and rstd = 1 / sqrt(var + eps),
         var biased (torch's training-mode normalization); Chan's merge, in closed form over the blocks;
      1: sum_rows d_bn and sum_rows d_bn * xhat (beta's and gamma's gradients) -> their means over M.
    merged: PHASE 0 also wrote each block's S = sum d_bn and D = sum d_bn * (u - block mean) (partial rows 2, 3),
    so sum d_bn * xhat = rstd * sum_blocks (D + (block mean - mean) * S) and PHASE 1 is not launched.
    Returns the keyword arguments of the last launch (PHASE 2: dZ)."""
    M, N = z.shape
    T = cdiv(M, rows)
    part = torch.zeros((4 if merged else 2, T, N), device=z.device, dtype=torch.float64)
    stat = torch.zeros((4, N), device=z.device, dtype=torch.float64)
    launch(part_ptr=part, stat_ptr=stat, PHASE=0)
    count = (M - torch.arange(T, device=z.device, dtype=torch.float64) * rows).clamp(max=rows)[:, None]
    mean = (count * part[0]).sum(0) / M
    m2 = part[1].sum(0) + (count * (part[0] - mean) ** 2).sum(0)
    stat[0], stat[1] = mean, torch.rsqrt(m2 / M + eps)
    if merged:
        stat[2] = part[2].sum(0) / M
        stat[3] = stat[1] * (part[3] + (part[0] - mean) * part[2]).sum(0) / M
    else:
        launch(part_ptr=part, stat_ptr=stat, PHASE=1)
        stat[2:] = part.sum(1) / M
    return {"part_ptr": part, "stat_ptr": stat, "PHASE": 2}


def split_rows_any(t: torch.Tensor, amax: torch.Tensor | None = None) -> tuple:
    """(hi, lo, scale) of t's rows as split_x / split_weight give them (bit for bit), for any 2-d fp32 t:
    row-major t through split_x; a transposed view (unit row stride: dZ^T, X^T for dW) through two tiled
    passes reading along its columns (gemm_core.split_transposed), never a torch transpose copy. `amax`: max
    |t[r, :]| per row where the caller has it (a generated dZ kernel's column maxima of dZ): the first pass is
    skipped."""
    if t.stride(1) == 1 or t.stride(0) != 1:
        return split_x(t if t.stride(1) == 1 else t.contiguous())
    return split_transposed(t, amax, pad=False)


@triton.jit
def split_t_blocks_kernel(t_ptr, x_scale_ptr, parts_ptr, inv_ptr, R, C, CP, stride_c,
                          BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """For t (R, C) with unit row stride (t = dZ^T, dZ (C, R) row-major): v = t[r, c] / x_scale[c] (exact: powers
    of two), then each (row, BLOCK_C-long stretch of columns) gets its own power of two s (_pow2_scale of the
    stretch's max |v|): parts (R, 2 CP) fp16 = [hi | lo] of v * s (zeros past C), inv (R, CP / BLOCK_C) = 1 / s.
    Tiles read along r (coalesced in dZ), written along c. Bytes: t read once (4 B/elem), 4 B/elem written."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_r = offs_r < R
    mask_c = offs_c < C
    v = tl.load(t_ptr + offs_r[:, None] + offs_c[None, :].to(tl.int64) * stride_c,
                mask=mask_r[:, None] & mask_c[None, :], other=0.0)
    v = v * _pow2_inv(tl.load(x_scale_ptr + offs_c, mask=mask_c, other=1.0))[None, :]
    s = _pow2_scale(tl.max(tl.abs(v), axis=1))
    tl.store(inv_ptr + offs_r.to(tl.int64) * (CP // BLOCK_C) + tl.program_id(1), _pow2_inv(s), mask=mask_r)
    vs = v * s[:, None]
    hi = vs.to(tl.float16)
    lo = (vs - hi.to(tl.float32)).to(tl.float16)
    out = offs_r[:, None].to(tl.int64) * 2 * CP + offs_c[None, :]
    mask = mask_r[:, None] & (offs_c < CP)[None, :]
    tl.store(parts_ptr + out, hi, mask=mask)
    tl.store(parts_ptr + out + CP, lo, mask=mask)


def split_dzt_blocks(dz: torch.Tensor, x_scale: torch.Tensor) -> tuple:
    """(hi, lo, inv) of A = dZ^T with x's row scales divided out, split per SCALE_BLOCK_K-long stretch of each row
    (split_t_blocks_kernel): the A operand of gemm_tile's A_BLOCKS loop, whose B is x's own forward split. hi, lo:
    (N, M) fp16 views of one (N, 2 MP) tensor, MP = padded_k(M), zeros past M; inv: (N, MP / SCALE_BLOCK_K) fp32."""
    dz = dz if dz.stride(1) == 1 else dz.contiguous()
    M, N = dz.shape
    MP, blk = padded_k(M), SCALE_BLOCK_K.value  # padded_k: a multiple of the block (PAD_K)
    parts = torch.empty((N, 2 * MP), device=dz.device, dtype=torch.float16)
    inv = torch.empty((N, MP // blk), device=dz.device, dtype=torch.float32)
    br = 64
    split_t_blocks_kernel[(cdiv(N, br), MP // blk)](dz, x_scale, parts, inv, N, M, MP, dz.stride(0),
                                                    BLOCK_R=br, BLOCK_C=blk, num_warps=4)
    return parts[:, :M], parts[:, MP:MP + M], inv
