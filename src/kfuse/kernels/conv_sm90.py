"""The convolution tile for Hopper (sm_90) in Gluon: kernels/gemm_sm90.py's asynchronous fp16x3p K loop fed by TMA
loads of a convolution's taps ("wide rows").

Why: kernels/conv.py's tile is plain Triton, which waits for every tl.dot (three per K block on fp16x3p) and gathers
each row's pixel through its own pointer: 316-338 TFLOP/s of fp16 work on an H100/H200, where the GEMM's Gluon
tile reaches 675-748 (benchmarks/conv/NOTES.md, "The convolution tile in Gluon").

Wide rows (stride 1 in every dim): the input is packed with its zero padding written out (pack_input with `pad`),
as (N, Dp, Hp, Wp) pixels of PIX values (each group's record: CP fp16 hi parts, then CP lo parts), Dp = OD +
DD * (KD - 1) and so on: the padded input a stride-1 "valid" convolution of it has the output's size. The tile's
rows are then the padded input's pixels p = ((n * Dp + d) * Hp + h) * Wp + w, and the output pixel (n, d, h, w)
reads, for tap (kd, kh, kw), the pixel p + (kd * DD * Hp + kh * DH) * Wp + kw * DW: for every tap the tile's rows
are CONSECUTIVE rows of the (N * Dp * Hp * Wp, PIX) packed matrix, a 2-d TMA box at a shifted row. So each K block
(BLOCK_K channels of one tap) is a GEMM block, loaded by the TMA unit (zero-filled past the last row) with no
per-row address or bounds check. Rows with d >= OD, h >= OH or w >= OW are computed and dropped (wide_rows' mask):
(Dp * Hp * Wp) / (OD * OH * OW) times the work, 1.03x for a 3 x 3 kernel on 128 x 128, 1.13x on 32 x 32.
A valid row's taps never leave its sample (d + kd * DD <= Dp - 1).

The K loop is gemm_sm90's: sm90_tile_mma on stages filled by a producer warp (conv_sm90_loader), hi*hi promoted
into the fp32 sum every CHUNK blocks, the cross products in their own accumulator. The weight is the packed,
split one of kernels/conv_pack.py (C_out, taps * CP), read at (the group's channel tile, tap * CP + c0). The grid is
persistent: a block per SM walks the groups' tiles (conv_sm90_tile_ids), its producer loading the next tile while
the consumer warps run the epilogue on the accumulator's layout (kernels/conv.py conv_bias_kernel_sm90; the
generated kernels' twins: regions/conv_twin.py). Measured on an H200: 1.26-1.33x the Triton tile's best (360-453
TFLOP/s of fp16 work on level 2 problems 1, 4 and 47), still 0.65x the GEMM tile's rate: the epilogue is not
overlapped with the next tile's products, and a K loop of 9 or 27 blocks fills and drains per tile.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kfuse.kernels.conv_pack import PACK
from kfuse.kernels.gemm_core import _pow2_inv
from kfuse.kernels.gemm_sm90 import gl, mbarrier, sm90_buffers, sm90_jit, tma


@triton.jit
def wide_sizes(M, OD, OH, OW, KD, KH, KW, DD, DH, DW):
    """(N, Dp, Hp, Wp): the samples and the padded input's dims of a stride-1 convolution (module docstring)."""
    return M // (OD * OH * OW), OD + DD * (KD - 1), OH + DH * (KH - 1), OW + DW * (KW - 1)


@triton.jit
def wide_rows(p, N, OD, OH, OW, Dp, Hp, Wp):
    """Wide rows p -> (offs_m, mask_m): the output pixel ((n * OD + d) * OH + h) * OW + w each stands for, and
    whether it is one (d < OD, h < OH, w < OW, n < N)."""
    w = p % Wp
    t = p // Wp
    h = t % Hp
    t = t // Hp
    d = t % Dp
    n = t // Dp
    return ((n * OD + d) * OH + h) * OW + w, (w < OW) & (h < OH) & (d < OD) & (n < N)


@sm90_jit
def conv_sm90_plan(M, C_in, OD, OH, OW, CIN_G, COUT_G, KD, KH, KW, DD, DH, DW, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(N, Dp, Hp, Wp, CP, NCB, n_k, row_tiles, col_tiles): the wide grid, a group's packed channels, the K blocks
    of a tap (BLOCK_K divides CP: conv.k_block) and of a tile, and the tiles of a group along rows and channels."""
    N, Dp, Hp, Wp = wide_sizes(M, OD, OH, OW, KD, KH, KW, DD, DH, DW)
    CP = gl.cdiv(CIN_G, PACK) * PACK
    NCB = CP // BLOCK_K
    return (N, Dp, Hp, Wp, CP, NCB, KD * KH * KW * NCB, gl.cdiv(N * Dp * Hp * Wp, BLOCK_M),
            gl.cdiv(COUT_G, BLOCK_N))


@sm90_jit
def conv_sm90_tile_ids(tile, row_tiles, col_tiles):
    """(pid_m, pid_n, g) of tile `tile`: a group's tiles are consecutive, its channel tiles innermost (consecutive
    tiles share their rows' loads in L2)."""
    per_group = row_tiles * col_tiles
    rem = tile % per_group
    return rem // col_tiles, rem % col_tiles, tile // per_group


@sm90_jit
def conv_sm90_setup(x_ptr, w_ptr, w_lo_ptr, stride_wn, M, C_in, OD, OH, OW, C_out, CIN_G, KD, KH, KW, DD, DH, DW,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """The block's TMA descriptors (the packed input as an (N * Dp * Hp * Wp, PIX) matrix, hi and lo column ranges
    of one descriptor; the weight's hi and lo, (C_out, taps * CP)), stages and barriers: gemm_sm90.sm90_setup's
    tuple."""
    N, Dp, Hp, Wp = wide_sizes(M, OD, OH, OW, KD, KH, KW, DD, DH, DW)
    CP = gl.cdiv(CIN_G, PACK) * PACK
    PIX = (C_in // CIN_G) * 2 * CP
    a_sl: tl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float16)
    b_sl: tl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], gl.float16)
    a_desc = tma.make_tensor_descriptor(x_ptr, [N * Dp * Hp * Wp, PIX], [PIX, 1], [BLOCK_M, BLOCK_K], a_sl)
    KTOT = KD * KH * KW * CP
    b_desc = tma.make_tensor_descriptor(w_ptr, [C_out, KTOT], [stride_wn, 1], [BLOCK_N, BLOCK_K], b_sl)
    b_lo_desc = tma.make_tensor_descriptor(w_lo_ptr, [C_out, KTOT], [stride_wn, 1], [BLOCK_N, BLOCK_K], b_sl)
    a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty = sm90_buffers(BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
    return (a_desc, a_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty)


@sm90_jit
def conv_sm90_loader(st, M, OD, OH, OW, C_in, CIN_G, COUT_G, KD, KH, KW, DD, DH, DW, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """Producer warp: every K block of this block's tiles (tiles program_id, + num_programs, ...), in the consumers'
    order, running ahead across tiles. K block `it` of a tile is tap it // NCB, channels (it % NCB) * BLOCK_K on:
    the input's hi and lo at the tile's rows shifted by the tap, the weight's at the tap's columns."""
    a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty = st
    N, Dp, Hp, Wp, CP, NCB, n_k, row_tiles, col_tiles = conv_sm90_plan(
        M, C_in, OD, OH, OW, CIN_G, COUT_G, KD, KH, KW, DD, DH, DW, BLOCK_M, BLOCK_N, BLOCK_K)
    i = 0
    for tile in range(gl.program_id(0), row_tiles * col_tiles * (C_in // CIN_G), gl.num_programs(0)):
        pid_m, pid_n, g = conv_sm90_tile_ids(tile, row_tiles, col_tiles)
        col0 = g * COUT_G + pid_n * BLOCK_N
        for it in range(n_k):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes the first wait
            bar = ready.index(s)
            mbarrier.expect(bar, 2 * (a_desc.block_type.nbytes + b_desc.block_type.nbytes))
            tap = it // NCB
            c0 = (it % NCB) * BLOCK_K
            row = pid_m * BLOCK_M + ((tap // (KH * KW)) * DD * Hp + ((tap // KW) % KH) * DH) * Wp + (tap % KW) * DW
            tma.async_copy_global_to_shared(a_desc, [row, g * 2 * CP + c0], bar, a_hi_s.index(s))
            tma.async_copy_global_to_shared(a_desc, [row, g * 2 * CP + CP + c0], bar, a_lo_s.index(s))
            tma.async_copy_global_to_shared(b_desc, [col0, tap * CP + c0], bar, b_hi_s.index(s))
            tma.async_copy_global_to_shared(b_lo_desc, [col0, tap * CP + c0], bar, b_lo_s.index(s))
            i += 1


@sm90_jit
def conv_sm90_scaled(acc, x_scale_ptr, w_scale_ptr, pid_m, pid_n, g, N, WIDE_S, COUT_G, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """acc with the rows' per-sample and the channels' powers of two undone (exact), in acc's layout; WIDE_S =
    Dp * Hp * Wp wide rows a sample."""
    rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc.type.layout))
    cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc.type.layout))
    a_s = gl.load(x_scale_ptr + gl.minimum(rows // WIDE_S, N - 1))
    b_s = gl.load(w_scale_ptr + g * COUT_G + gl.minimum(cols, COUT_G - 1))
    return acc * _pow2_inv(a_s)[:, None] * _pow2_inv(b_s)[None, :]
