"""fp32-accurate convolutions on tensor cores as implicit GEMMs (plain Triton + torch; pasted into generated files).

Conv1d/2d/3d forward, NC(D)HW contiguous fp32 input, any stride, padding (ints, tuples, 'same', 'valid'),
dilation and groups (depthwise too), with or without bias. 1-d and 2-d convolutions run as 3-d ones with unit
leading spatial dims (conv_geometry), so one kernel serves all three.

The GEMM view (one program per output tile, one group per program_id(1)):
  rows    M = N * OD * OH * OW output pixels (n, od, oh, ow), row-major as the output's spatial dims;
  cols    the C_out / groups output channels of group g;
  K       KD * KH * KW taps of CP = CIN_G rounded up to 16 (PACK) channels, ordered (kd, kh, kw, ci).
The operands are packed for that K order (implicit im2col: no im2col buffer is ever written):
  x       pack_input, once per call (one Triton pass): pixel-major records, per pixel and group the CP channels
          (zeros past CIN_G); on "fp16x3p" the fp16 hi parts of x * s[n] then the lo parts (4 bytes an element,
          as x's fp32), else the fp32 values;
  weight  packed_weight, once per version (cached_conv_weight): (C_out, taps * CP), zeros in the padding, split
          on "fp16x3p".
The tile walks K tap by tap, BLOCK_K channels at a time (BLOCK_K divides CP: k_block): a row's input pixel for a
tap is output index * stride - pad + tap * dilation, one bounds check per row and tap (outside the input: the zero
padding), and its BLOCK_K channels are contiguous, so the loads are 16-byte vectors with no K mask, which Triton
pipelines (cp.async; wgmma on sm_90). The accumulator is the (pixels, channels) tile of the output; conv_tile
returns it and the caller's epilogue stores it to the NC(D)HW layout (conv_out_offsets): along a column the pixels
are contiguous, so the stores are coalesced. Padding a group of 3 or 8 channels to 16 multiplies the tensor-core
work by 16 / CIN_G, and each tap is then one 16-deep K block: such convolutions ran far from their floors on an H100
(20-90 TFLOP/s of fp16 work, benchmarks/conv/NOTES.md "The packed tile"). Dense K (dense_k; KFUSE_CONV_DENSE=1):
a group of fewer than DENSE_BELOW channels is packed as im2col rows instead (pack_im2col: per output pixel and group
its taps * CIN_G values, zeros past them to a multiple of DENSE_K_ALIGN), so the tile is a plain GEMM over them:
unmasked, contiguous K blocks and no per-tap bounds checks, for a write and a read of those rows. The direct tile
(direct_k, on unless KFUSE_CONV_DIRECT=0; dense K where turned on comes first): a narrow group (fewer than
DIRECT_BELOW input channels, CIN_G x COUT_G at most DIRECT_WORK) skips the pack and the tensor cores, a loop over its
channels and taps on CUDA cores (kernels/conv_direct.py). On a Hopper GPU a stride-1 convolution with groups of more
than 16 channels runs kernels/conv_sm90.py's tile in Gluon instead (wide_ok; sm90 configs, the kernels' twins:
regions/conv_twin.py), x packed with its padding written out.

Precision: the scheme comes from the same switch as the GEMM's (conv_scheme -> runtime.scheme_for):
  "fp16x3p" on a GPU: the fp16 hi/lo split of kernels/gemm_core.py. The weight is split once per version
            (split_weight on the packed (C_out, K) matrix, one power of two per output channel); the activation
            is split by pack_input, scaled by one power of two per SAMPLE (conv_x_scales: its max |x| lands in
            [2^14, 2^15), so fp16 neither overflows nor loses lo below its normal range for any value within
            2^-17 of the sample's largest; the bits lost below that are under 2^-38 of it, far below the fp32
            sum's own rounding). Three fp16 products per K block (lo*hi + hi*lo + hi*hi) go into a fresh
            tensor-core partial that is added to the fp32 register accumulator (gemm_core's "promotion").
            A per-pixel scale, as the GEMM's per-row one, would need the max over each pixel's patch.
  "tf32x3"  Triton's three-pass TF32 dot.
  "ieee"    fp32 FMA dots (Triton's interpreter ignores input_precision; its fp16 dots are numpy's fp32 sums of
            exact fp16 products, so tests exercise "fp16x3p" there too).
  "fp64"    what the interpreter runs on the CPU: fp32 dots over 16-deep K blocks, each block's sum promoted
            into a float64 accumulator, rounded to fp32 once (conv_scheme says why; Triton has no float64 dot).
  "direct32" the direct tile's on a GPU: fp32 products and sums in (tap, channel) order.
  "direct64" the direct tile's in the interpreter (and on a GPU under KFUSE_CONV_DIRECT=64): exact fp32 products
            summed in float64, rounded once.

Cost of one call: 2 * M * C_out/g * taps * CP flops per group (three fp16 products on "fp16x3p"); bytes: x read
twice and its packed copy written once (scales and pack_input), the packed copy read once from HBM (the taps' reuse
of each value across a tile's rows and its K loop is served by L1/L2), the weight's hi + lo (4 bytes per element)
once per row tile, the output written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.kernels.conv_config import (
    DIRECT_SCHEMES,
    ConvConfig,
    conv_config,
    conv_grid,
    conv_options,
    pick_conv,
    sm90_config,
)
from kfuse.kernels.conv_direct import conv_direct_at
from kfuse.kernels.conv_geometry import DIRECT_FP64, SM90_ON, ConvGeometry, conv_geometry
from kfuse.kernels.conv_pack import (
    DENSE_K_ALIGN,
    PACK,
    cached_conv_weight,
    pack_im2col,
    pack_input,
    packed_channels,
    packed_record,
    weight_parts,
)
from kfuse.kernels.conv_sm90 import (
    conv_sm90_loader,
    conv_sm90_plan,
    conv_sm90_scaled,
    conv_sm90_setup,
    conv_sm90_tile_ids,
    wide_rows,
)
from kfuse.kernels.gemm_core import _pow2_inv, ensure_tma_allocator
from kfuse.kernels.gemm_sm90 import gl, sm90_jit, sm90_tile_mma
from kfuse.kernels.runtime import GEMM_SCHEME, SETTINGS, scheme_for, sm90_ok

# ----------------------------------------------------------------------------------------------------------------
# the scheme and the operands (packed by kernels/conv_pack.py)
# ----------------------------------------------------------------------------------------------------------------


def conv_scheme(x: torch.Tensor, geo: ConvGeometry | None = None) -> str:
    """The scheme of a convolution of x in this file. A geometry of few channels a group (geo.direct) runs the direct
    tile: on a GPU "direct32", fp32 products and sums as eager's own fp32 convolution (on an H200 within 0.96-1.32x
    strict cuDNN's error against float64, and 2.7x faster than "direct64": benchmarks/conv/NOTES.md, "The direct
    tile"; KFUSE_CONV_DIRECT=64 picks "direct64" there too); in the interpreter "direct64", exact products summed in
    float64 (the CPU's eager convolution sums more accurately than one fp32 chain, see below). Else the GEMM's
    (runtime.scheme_for on GEMM_SCHEME) on a GPU; in the interpreter "fp64" (16-deep fp32 dots summed in float64,
    rounded once): plain fp32 dots missed rule 3 by 1% on KernelBench level 2 problem 27 (Conv3d, GroupNorm, mean:
    3.8e-6 against 2 x eager's 1.84e-6 + 1e-7; with "fp64" 1.0e-6 against eager's 0.95e-6), where the CPU's eager
    convolution sums more accurately than one fp32 dot."""
    compiled = x.is_cuda and not SETTINGS.interpret
    if geo is not None and geo.direct:
        return "direct32" if compiled and not DIRECT_FP64 else "direct64"
    return scheme_for(GEMM_SCHEME, compiled) if compiled else "fp64"


def direct_operands(x: torch.Tensor, weight: torch.Tensor) -> tuple:
    """(x, w, w, x, x, stride_wn) for the direct tile (kernels/conv_direct.py): x as it is and the weight as
    (C_out, CIN_G * taps), its own layout (a view of a contiguous fp32 weight); unused pointers repeat x or w."""
    w2 = weight.detach().reshape(weight.shape[0], -1).float().contiguous()
    return x, w2, w2, x, x, w2.stride(0)


def wide_ok(x: torch.Tensor, geo: ConvGeometry, scheme: str) -> bool:
    """Whether the convolution runs kernels/conv_sm90.py's Gluon tile (wide rows): a Hopper GPU with Gluon
    (runtime.sm90_ok), "fp16x3p", stride 1, the packed (not dense, not direct) tile with groups of more than 16
    channels (SM90_MIN_CP), the padded input's rows addressable by TMA's 32-bit coordinates; KFUSE_CONV_SM90=0
    turns it off."""
    return (SM90_ON and scheme == "fp16x3p" and geo.stride1 and not geo.dense and not geo.direct
            and packed_channels(geo.CIN_G) >= SM90_MIN_CP and 0 < geo.wide_pixels < 2 ** 31 and sm90_ok(x))


# A group of 16 packed channels or fewer (CP = 16: 8-channel groups, say) makes 16-deep K blocks, a 32-byte row per
# TMA box: on an H200 the Gluon tile (one tile a block) took 1.5 ms on level 2 problem 57's convolution where the
# Triton tile took 0.81 (benchmarks/conv/NOTES.md, "The convolution tile in Gluon"); such groups keep the Triton tile.
SM90_MIN_CP = 32


def conv_operands(x: torch.Tensor, weight: torch.Tensor, geo: ConvGeometry, scheme: str,
                  cached: bool = True, wide: bool = False) -> tuple:
    """(x, w, w_lo, w_scale, x_scale, stride_wn): what conv_tile reads under `scheme`, packed (pack_input, or
    pack_im2col for dense K; weight_parts: the weight's parts cached for a parameter). Unused pointers repeat x.
    The direct tile reads x and the weight as they are (direct_operands). `wide`: x packed on the padded grid of
    kernels/conv_sm90.py's wide rows."""
    if scheme in DIRECT_SCHEMES:
        return direct_operands(x, weight)
    split, dense = scheme == "fp16x3p", geo.dense
    if dense:
        xp, x_scale = pack_im2col(x, geo, split)
    else:
        xp, x_scale = pack_input(x, geo.groups, split, geo.wide_pad() if wide else None)
    w, w_lo, w_scale, stride_wn = (cached_conv_weight(weight, scheme, dense) if cached
                                   else weight_parts(weight, scheme, dense))
    return xp, w, w_lo, w_scale, xp if x_scale is None else x_scale, stride_wn


def conv_plan(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int,
              scheme: str | None = None, direct: bool = True, sm90: bool = False) -> tuple:
    """(geo, scheme, cfg, ops, sizes) for one launch of a conv_tile kernel on contiguous x: its geometry, scheme
    (conv_scheme unless given; `direct=False`: never the direct tile), tile config (conv_config), operand tensors and
    size arguments (conv_tile's order). A parameter's packed weight is cached (cached_conv_weight); any other weight
    is packed on every call. `sm90`: the caller has a Hopper twin (kernels/conv_sm90.py's tile on wide rows), taken
    where wide_ok holds: the config is then an sm90 one and x is packed on the padded grid."""
    geo = conv_geometry(tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups)
    scheme = scheme or conv_scheme(x, geo if direct else None)
    wide = sm90 and wide_ok(x, geo, scheme)
    if wide:
        ensure_tma_allocator()  # the Gluon tile makes its TMA descriptors on the device
    cfg = sm90_config(geo) if wide else conv_config(geo, scheme, SETTINGS.interpret)
    *ops, stride_wn = conv_operands(x, weight, geo, scheme, cached=isinstance(weight, torch.nn.Parameter), wide=wide)
    return geo, scheme, cfg, tuple(ops), (stride_wn, *geo.args())


# ----------------------------------------------------------------------------------------------------------------
# the tile
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def conv_tile_ids(COUT_G, BLOCK_N: tl.constexpr):
    """(row tile, column tile, group) of this program: consecutive programs share a row tile (its gathered
    activations are then served from L1/L2) and walk the group's channel tiles."""
    n_tiles = tl.cdiv(COUT_G, BLOCK_N)
    pid = tl.program_id(0)
    return pid // n_tiles, pid % n_tiles, tl.program_id(1)


@triton.jit
def conv_tile(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, stride_wn, pid_m, pid_n, g,
              M, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCHEME: tl.constexpr,
              DENSE: tl.constexpr):
    """The fp32 (BLOCK_M, BLOCK_N) accumulator of output pixels pid_m * BLOCK_M + i and channels
    g * COUT_G + pid_n * BLOCK_N + j of group g (no bias), from the packed operands (conv_operands). Rows past M and
    channels past the group are computed from zeros or clamped reads: the caller masks its store."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    S_out = OD * OH * OW
    sp = offs_m % S_out
    return conv_tile_at(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, stride_wn, offs_m // S_out,
                        sp // (OH * OW), (sp // OW) % OH, sp % OW, offs_m < M, pid_n, g,
                        C_in, D, H, W, OD, OH, OW, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
                        BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, DENSE)


@triton.jit
def conv_tile_at(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, stride_wn, n_idx, od, oh, ow, mask_m, pid_n, g,
                 C_in, D, H, W, OD, OH, OW, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCHEME: tl.constexpr,
                 DENSE: tl.constexpr):
    """conv_tile at any BLOCK_M output pixels: row i is pixel (od[i], oh[i], ow[i]) of sample n_idx[i], computed
    where mask_m[i] (rows outside it read nothing and hold zeros). Any pixel: a pooling kind's rows are pooled
    pixels, each program walking its windows' conv pixels (kernels/pooling.py). The direct schemes run
    kernels/conv_direct.py's loop (x and the weight as they are: conv_operands), the others the implicit GEMM
    (conv_gemm_at, on the packed operands)."""
    if SCHEME == "direct64":
        acc = conv_direct_at(x_ptr, w_ptr, stride_wn, n_idx, od, oh, ow, mask_m, pid_n, g, C_in, D, H, W, CIN_G,
                             COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, BLOCK_M, BLOCK_N, True)
    elif SCHEME == "direct32":
        acc = conv_direct_at(x_ptr, w_ptr, stride_wn, n_idx, od, oh, ow, mask_m, pid_n, g, C_in, D, H, W, CIN_G,
                             COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, BLOCK_M, BLOCK_N, False)
    else:
        acc = conv_gemm_at(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, stride_wn, n_idx, od, oh, ow, mask_m,
                           pid_n, g, C_in, D, H, W, OD, OH, OW, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW,
                           DD, DH, DW, BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, DENSE)
    return acc


@triton.jit
def conv_gemm_at(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, stride_wn, n_idx, od, oh, ow, mask_m, pid_n, g,
                 C_in, D, H, W, OD, OH, OW, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCHEME: tl.constexpr,
                 DENSE: tl.constexpr):
    """conv_tile_at's implicit GEMM on the packed operands (conv_operands), at pixels as conv_tile_at's.

    K is walked tap by tap, BLOCK_K packed channels at a time: a tap's bounds check is one per row (not per
    element), and each row's BLOCK_K channels are contiguous in the packed input (vectorized loads). DENSE
    (dense_k): x holds im2col rows (pack_im2col), one per output pixel and group, read as a plain GEMM operand:
    KP = dense_columns(taps * CIN_G) columns in contiguous, unmasked blocks, the zero padding already in them."""
    if DENSE:  # the row's im2col record of KP columns (rows outside mask_m are never read)
        CP = tl.cdiv(KD * KH * KW * CIN_G, DENSE_K_ALIGN) * DENSE_K_ALIGN  # KP
        REC = packed_record(CP, SCHEME == "fp16x3p")  # hi, then lo
        x_rows = x_ptr + ((((n_idx.to(tl.int64) * OD + od) * OH + oh) * OW + ow) * (C_in // CIN_G) + g) * REC
        n_blocks = CP // BLOCK_K  # BLOCK_K divides KP (k_block)
    else:  # each row's pointer at its window's corner (may lie outside the input: such reads are masked)
        CP = tl.cdiv(CIN_G, PACK) * PACK  # a group's channels in a record
        REC = packed_record(CP, SCHEME == "fp16x3p")  # hi, then lo
        id0 = od * SD - PD  # output pixel -> the input corner its window starts at
        ih0 = oh * SH - PH
        iw0 = ow * SW - PW
        PIX = (C_in // CIN_G) * REC  # elements per input pixel
        x_rows = x_ptr + (((n_idx.to(tl.int64) * D + id0) * H + ih0) * W + iw0) * PIX + g * REC
        NCB = tl.cdiv(CP, BLOCK_K)
        n_blocks = KD * KH * KW * NCB
    offs_k = tl.arange(0, BLOCK_K)
    offs_c = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = (g * COUT_G + tl.minimum(offs_c, COUT_G - 1)).to(tl.int64) * stride_wn  # clamped: in bounds
    if SCHEME == "fp16x3p":
        a_s = tl.load(x_scale_ptr + n_idx, mask=mask_m, other=1.0)
    if SCHEME == "fp64":
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for it in range(0, n_blocks):
        if DENSE:
            k0 = it * BLOCK_K
            a_ptrs = x_rows[:, None] + k0 + offs_k[None, :]
            a_mask = mask_m[:, None]
        else:
            tap = it // NCB
            c0 = (it % NCB) * BLOCK_K
            kd = tap // (KH * KW)
            kh = (tap // KW) % KH
            kw = tap % KW
            di = id0 + kd * DD
            hh = ih0 + kh * DH
            wi = iw0 + kw * DW
            inside = mask_m & (di >= 0) & (di < D) & (hh >= 0) & (hh < H) & (wi >= 0) & (wi < W)
            # BLOCK_K divides CP (k_block): no K mask, so the loads are vectorized along the channels and pipelined
            a_mask = inside[:, None]  # outside the input: the zero padding
            tap_off = (((kd * DD).to(tl.int64) * H + kh * DH) * W + kw * DW) * PIX  # int64: a sample may pass 2^31
            a_ptrs = x_rows[:, None] + tap_off + c0 + offs_k[None, :]
            k0 = tap * CP + c0
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        b_off = w_rows[None, :] + (k0 + offs_k)[:, None]
        b = tl.load(w_ptr + b_off)
        if SCHEME == "fp16x3p":
            a_lo = tl.load(a_ptrs + CP, mask=a_mask, other=0.0)
            b_lo = tl.load(w_lo_ptr + b_off)
            part = tl.dot(a_lo, b)
            part = tl.dot(a, b_lo, part)
            part = tl.dot(a, b, part)
            acc = acc + part  # a fresh partial per K block, added with a round-to-nearest FADD (gemm_core)
        elif SCHEME == "fp64":  # each K block's fp32 dot promoted into the float64 sum (Triton has no fp64 dot)
            acc += tl.dot(a, b, input_precision="ieee").to(tl.float64)
        else:
            acc = tl.dot(a, b, acc, input_precision=SCHEME)
    if SCHEME == "fp16x3p":  # undo the per-sample and per-channel powers of two (exact)
        b_s = tl.load(w_scale_ptr + g * COUT_G + tl.minimum(offs_c, COUT_G - 1))
        acc = acc * _pow2_inv(a_s)[:, None] * _pow2_inv(b_s)[None, :]
    return acc.to(tl.float32)


@triton.jit
def conv_out_offsets(offs_m, offs_n, OD, OH, OW, C_out):
    """Element offsets in the NC(D)HW output of pixels offs_m (rows) and global channels offs_n (columns)."""
    S_out = OD * OH * OW
    n_idx = offs_m // S_out
    sp = offs_m % S_out
    return (n_idx.to(tl.int64) * C_out * S_out + sp)[:, None] + (offs_n.to(tl.int64) * S_out)[None, :]


# ----------------------------------------------------------------------------------------------------------------
# the plain convolution (+ bias): the tile with the smallest epilogue, for tests and direct use
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def conv_bias_kernel(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, bias_ptr, out_ptr, stride_wn,
                     M, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW,
                     DD, DH, DW, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, SCHEME: tl.constexpr, DENSE: tl.constexpr):
    """out = conv(x, w) + bias, NC(D)HW. Bytes: x read once, w once per row tile, out written once."""
    pid_m, pid_n, g = conv_tile_ids(COUT_G, BLOCK_N)
    acc = conv_tile(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, stride_wn, pid_m, pid_n, g,
                    M, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
                    BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, DENSE)
    store_with_bias(acc, bias_ptr, out_ptr, pid_m, pid_n, g, M, OD, OH, OW, C_out, COUT_G, HAS_BIAS, BLOCK_M, BLOCK_N)


@triton.jit
def store_with_bias(acc, bias_ptr, out_ptr, pid_m, pid_n, g, M, OD, OH, OW, C_out, COUT_G, HAS_BIAS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A plain convolution tile's epilogue (the standalone kernels'): + bias where given, stored NC(D)HW."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    store_with_bias_at(acc, bias_ptr, out_ptr, offs_m, offs_m < M, pid_n * BLOCK_N + tl.arange(0, BLOCK_N), g, OD,
                       OH, OW, C_out, COUT_G, HAS_BIAS)


@triton.jit
def store_with_bias_at(acc, bias_ptr, out_ptr, offs_m, mask_m, offs_c, g, OD, OH, OW, C_out, COUT_G,
                       HAS_BIAS: tl.constexpr):
    """acc (+ bias) stored NC(D)HW at output pixels offs_m where mask_m, channels g * COUT_G + offs_c."""
    offs_n = g * COUT_G + offs_c
    mask_n = offs_c < COUT_G
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + conv_out_offsets(offs_m, offs_n, OD, OH, OW, C_out), acc, mask=mask_m[:, None] & mask_n[None, :])


@sm90_jit
def conv_bias_tiles_sm90(st, x_scale_ptr, w_scale_ptr, bias_ptr, out_ptr, M, C_in, OD, OH, OW, C_out, CIN_G, COUT_G,
                         KD, KH, KW, DD, DH, DW, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, STAGES: tl.constexpr, CHUNK: tl.constexpr):
    """conv_bias_kernel_sm90's consumer warps: each of the block's tiles (kernels/conv_sm90.py's order), its K loop
    (gemm_sm90.sm90_tile_mma), then its epilogue on the accumulator's layout while the producer loads the next."""
    N, Dp, Hp, Wp, CP, NCB, n_k, row_tiles, col_tiles = conv_sm90_plan(
        M, C_in, OD, OH, OW, CIN_G, COUT_G, KD, KH, KW, DD, DH, DW, BLOCK_M, BLOCK_N, BLOCK_K)
    i = 0
    for tile in range(tl.program_id(0), row_tiles * col_tiles * (C_in // CIN_G), tl.num_programs(0)):
        pid_m, pid_n, g = conv_sm90_tile_ids(tile, row_tiles, col_tiles)
        acc = sm90_tile_mma(st, i, n_k, BLOCK_M, BLOCK_N, STAGES, CHUNK)
        acc = conv_sm90_scaled(acc, x_scale_ptr, w_scale_ptr, pid_m, pid_n, g, N, Dp * Hp * Wp, COUT_G, BLOCK_M,
                               BLOCK_N)
        offs_m, mask_m = wide_rows(pid_m * BLOCK_M + gl.arange(0, BLOCK_M), N, OD, OH, OW, Dp, Hp, Wp)
        store_with_bias_at(acc, bias_ptr, out_ptr, offs_m, mask_m, pid_n * BLOCK_N + gl.arange(0, BLOCK_N), g, OD,
                           OH, OW, C_out, COUT_G, HAS_BIAS)
        i += n_k


@sm90_jit
def conv_bias_kernel_sm90(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, bias_ptr, out_ptr, stride_wn,
                          M, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW,
                          DD, DH, DW, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, SCHEME: tl.constexpr, DENSE: tl.constexpr,
                          STAGES: tl.constexpr = 3, CHUNK: tl.constexpr = 4):
    """conv_bias_kernel (its parameters) on kernels/conv_sm90.py's tile over wide rows, x packed on the padded grid
    (conv_operands with `wide`): a persistent grid (conv_grid of an sm90 config), a producer warp loading, the
    consumer warps computing and storing."""
    st = conv_sm90_setup(x_ptr, w_ptr, w_lo_ptr, stride_wn, M, C_in, OD, OH, OW, C_out, CIN_G, KD, KH, KW, DD, DH,
                         DW, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
    gl.warp_specialize([
        (conv_bias_tiles_sm90, (st, x_scale_ptr, w_scale_ptr, bias_ptr, out_ptr, M, C_in, OD, OH, OW, C_out, CIN_G,
                                COUT_G, KD, KH, KW, DD, DH, DW, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, CHUNK)),
        (conv_sm90_loader, (st, M, OD, OH, OW, C_in, CIN_G, COUT_G, KD, KH, KW, DD, DH, DW, BLOCK_M, BLOCK_N, BLOCK_K,
                            STAGES)),
    ], [1], [24])


def conv_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1, padding=0,
                 dilation=1, groups: int = 1, scheme: str | None = None, cfg: ConvConfig | None = None) -> torch.Tensor:
    """conv{1,2,3}d(x, weight, bias, stride, padding, dilation, groups) by conv_bias_kernel; no autograd.
    `scheme`: None for this file's (conv_scheme); `cfg`: None for conv_config's."""
    x = x.contiguous()
    geo, scheme, default_cfg, ops, sizes = conv_plan(x, weight, stride, padding, dilation, groups, scheme, sm90=True)
    cfg = cfg or default_cfg
    if cfg.sm90 != default_cfg.sm90:
        raise ValueError(f"conv_forward: config {cfg.short()} for {'wide' if default_cfg.sm90 else 'packed'} operands")
    out = torch.empty(geo.out_shape, device=x.device, dtype=x.dtype)
    if geo.M:
        kernel = pick_conv(conv_bias_kernel, conv_bias_kernel_sm90, cfg)
        kernel[conv_grid(geo, cfg)](*ops, out if bias is None else bias, out, *sizes, HAS_BIAS=bias is not None,
                                    BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SCHEME=scheme,
                                    DENSE=geo.dense, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                                    **conv_options(cfg))
    return out


def conv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1, padding=0,
             dilation=1, groups: int = 1) -> torch.Tensor:
    """Plain torch reference (computes in x's dtype: pass float64 tensors for the accuracy reference)."""
    fn = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d, 5: torch.nn.functional.conv3d}[x.dim()]
    return fn(x, weight, bias, stride, padding, dilation, groups)
