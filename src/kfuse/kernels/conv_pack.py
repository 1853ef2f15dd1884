"""The packed operands of the convolution tile (kernels/conv.py): the input's pixel-major records (pack_input) or,
for groups of few channels, its im2col rows (pack_im2col, dense K), and the weight's packed, split matrix
(packed_weight, cached per version). kernels/conv.py's docstring gives the layouts' reasons and costs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.kernels.conv_geometry import ConvGeometry
from kfuse.kernels.gemm_core import _pow2_scale_torch, cdiv, split_weight
from kfuse.kernels.runtime import SETTINGS, tensor_key

# Triton's CPU interpreter runs each program as numpy code behind a Python front end that costs ~0.5 ms per tl op
# (about 300 per program here) whatever the tile's size: few, large tiles, up to Triton's 2^20 elements per block.
# A 3 -> 4 channel 3x3 conv of 100k output pixels took 6.6 s in 8192-row tiles, 4.1 s in 32768-row ones.
INTERPRETER_ELEMENTS = 2 ** 20


# a group's input channels are zero-padded to a multiple of this in the packed operands: tl.dot's least K
PACK: tl.constexpr = tl.constexpr(16)
# the im2col rows' K (and the dense weight's) is padded to a multiple of this, which every dense K block divides
DENSE_K_ALIGN: tl.constexpr = tl.constexpr(32)


def packed_channels(cin_g: int) -> int:
    """CP: the channels of one group's record in the packed input and, padded, of one tap in the packed weight."""
    return cdiv(cin_g, PACK.value) * PACK.value


def dense_columns(K: int) -> int:
    """KP: dense K's im2col row (and weight row) length for K = taps * CIN_G, a multiple of DENSE_K_ALIGN."""
    return cdiv(K, DENSE_K_ALIGN.value) * DENSE_K_ALIGN.value


@triton.jit
def packed_record(CP, SPLIT: tl.constexpr):
    """REC in the kernels: the elements of a group's record of CP values in the packed input (on SPLIT the hi
    parts, then the lo parts)."""
    if SPLIT:
        REC = 2 * CP
    else:
        REC = CP
    return REC


def packed_weight(weight: torch.Tensor, dense: bool = False) -> torch.Tensor:
    """(C_out, CIN_G, KD, KH, KW) -> the (C_out, K) fp32 GEMM operand, K ordered (tap, channel): each tap's
    channels zero-padded to CP (K = taps * CP), so a K block of the tile is BLOCK_K channels of one tap; dense, the
    taps' channels back to back and zeros only at the end (dense_columns), as in the im2col rows."""
    c_out, cin_g = weight.shape[:2]
    w = weight.detach().float().reshape(c_out, cin_g, -1).transpose(1, 2)  # (C_out, taps, CIN_G)
    if dense:
        w = w.reshape(c_out, -1)
        return torch.nn.functional.pad(w, (0, dense_columns(w.shape[1]) - w.shape[1])).contiguous()
    return torch.nn.functional.pad(w, (0, packed_channels(cin_g) - cin_g)).reshape(c_out, -1).contiguous()


def weight_parts(weight: torch.Tensor, scheme: str, dense: bool = False) -> tuple:
    """(w, w_lo, w_scale, stride_wn) of the packed weight: on "fp16x3p" its fp16 hi/lo split (split_weight: one
    power of two per output channel; views of one buffer), else the fp32 matrix (w_lo and w_scale repeat it)."""
    wp = packed_weight(weight, dense)
    if scheme != "fp16x3p":
        return wp, wp, wp, wp.stride(0)
    w_hi, w_lo, w_scale = split_weight(wp)
    return w_hi, w_lo, w_scale, w_hi.stride(0)


def cached_parts(weight: torch.Tensor, attr: str, key: tuple, make) -> tuple:
    """make()'s parts of the weight, kept on it under `attr` and reused while `key` is the same: key starts with the
    weight's tensor_key (its storage and version counter: an optimizer step, load_state_dict or an in-place write
    under no_grad invalidate it, as runtime.cached_split's)."""
    hit = getattr(weight, attr, None)
    if hit is not None and hit[0] == key:
        return hit[1]
    with torch.no_grad():
        parts = make()
    setattr(weight, attr, (key, parts))
    return parts


def cached_conv_weight(weight: torch.Tensor, scheme: str, dense: bool = False) -> tuple:
    """weight_parts, made once per version of the weight (cached_parts)."""
    return cached_parts(weight, "_kfuse_conv_weight", (tensor_key(weight), scheme == "fp16x3p", dense),
                     lambda: weight_parts(weight, scheme, dense))


def conv_x_scales(x: torch.Tensor) -> torch.Tensor:
    """One power of two per sample of x (N, ...): max |x[n]| * s[n] in [2^14, 2^15) (gemm_core's _pow2_scale).
    One read of x: the infinity norm is max |x| without an |x| copy (exact: no rounding in a max)."""
    amax = torch.linalg.vector_norm(x.detach().reshape(x.shape[0], -1), float("inf"), dim=1)
    return _pow2_scale_torch(amax.float())


@triton.jit
def conv_pack_kernel(x_ptr, scale_ptr, out_ptr, P, C_in, CIN_G, D, H, W, Dp, Hp, Wp, PD, PH, PW,
                     SPLIT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """x (N, C_in, D, H, W) -> the packed input (pack_input) of P = N * Dp * Hp * Wp pixels: x's pixels at
    (d + PD, h + PH, w + PW) of a (Dp, Hp, Wp) grid, zeros elsewhere (Dp = D and PD = 0 and so on: no padding).
    Program (pixel block, group, channel block): reads coalesced along the pixels, writes along the channels."""
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    g = tl.program_id(1)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    CP = tl.cdiv(CIN_G, PACK) * PACK
    REC = packed_record(CP, SPLIT)
    mask_p = offs_p < P
    w = offs_p % Wp - PW
    t = offs_p // Wp
    h = t % Hp - PH
    t = t // Hp
    d = t % Dp - PD
    n = t // Dp
    inside = mask_p & (w >= 0) & (w < W) & (h >= 0) & (h < H) & (d >= 0) & (d < D)
    src = (n.to(tl.int64) * C_in + g * CIN_G) * (D * H * W) + (d * H + h) * W + w
    v = tl.load(x_ptr + src[:, None] + offs_c[None, :].to(tl.int64) * (D * H * W),
                mask=inside[:, None] & (offs_c < CIN_G)[None, :], other=0.0).to(tl.float32)
    dst = out_ptr + (offs_p.to(tl.int64) * (C_in // CIN_G) + g)[:, None] * REC + offs_c[None, :]
    mask = mask_p[:, None] & (offs_c < CP)[None, :]
    store_record(dst, v, CP, mask, scale_ptr, n, mask_p, SPLIT)


@triton.jit
def store_record(dst, v, CP, mask, scale_ptr, n, mask_p, SPLIT: tl.constexpr):
    """Store the fp32 values v (rows of samples n) at dst: on SPLIT, gemm_core's split of v * s[n] (exact) = hi + lo
    to ~2^-22 relative, hi at dst and lo CP elements on; else v."""
    if SPLIT:
        vs = v * tl.load(scale_ptr + n, mask=mask_p, other=1.0)[:, None]
        hi = vs.to(tl.float16)
        tl.store(dst, hi, mask=mask)
        tl.store(dst + CP, (vs - hi.to(tl.float32)).to(tl.float16), mask=mask)
    else:
        tl.store(dst, v, mask=mask)


@triton.jit
def conv_im2col_kernel(x_ptr, scale_ptr, out_ptr, M, C_in, D, H, W, OD, OH, OW, CIN_G, KD, KH, KW, SD, SH, SW,
                       PD, PH, PW, DD, DH, DW, KP, SPLIT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr):
    """x (N, C_in, D, H, W) -> dense K's im2col rows (pack_im2col). Program (output pixel block, group, K block):
    column k of a row is (tap k // CIN_G, channel k % CIN_G) at the pixel's window, zero outside the input and past
    taps * CIN_G. An element's address is separable, the pixel's window corner (int64, per row) plus the column's
    channel and tap offset (per column), and so are its bounds: an element costs a 64-bit add, three adds and six
    compares."""
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    g = tl.program_id(1)
    k = tl.program_id(2) * BLOCK_K + tl.arange(0, BLOCK_K)
    S = OD * OH * OW
    n = offs_p // S
    sp = offs_p % S
    id0 = (sp // (OH * OW)) * SD - PD  # the window's corner, per row
    ih0 = ((sp // OW) % OH) * SH - PH
    iw0 = (sp % OW) * SW - PW
    tap = k // CIN_G
    dd = (tap // (KH * KW)) * DD  # the tap's offset, per column
    dh = ((tap // KW) % KH) * DH
    dw = (tap % KW) * DW
    corner = (((n.to(tl.int64) * C_in + g * CIN_G) * D + id0) * H + ih0) * W + iw0
    offset = ((((k - tap * CIN_G).to(tl.int64) * D + dd) * H + dh) * W + dw)  # per column: int64 costs nothing
    di = id0[:, None] + dd[None, :]
    hh = ih0[:, None] + dh[None, :]
    wi = iw0[:, None] + dw[None, :]
    mask_p = offs_p < M
    inside = ((mask_p[:, None] & (k < KD * KH * KW * CIN_G)[None, :]) & (di >= 0) & (di < D) & (hh >= 0)
              & (hh < H) & (wi >= 0) & (wi < W))
    v = tl.load(x_ptr + corner[:, None] + offset[None, :], mask=inside, other=0.0).to(tl.float32)
    dst = out_ptr + (offs_p.to(tl.int64) * (C_in // CIN_G) + g)[:, None] * packed_record(KP, SPLIT) + k[None, :]
    store_record(dst, v, KP, mask_p[:, None] & (k < KP)[None, :], scale_ptr, n, mask_p, SPLIT)


def packed_buffer(x: torch.Tensor, values: int, split: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(an empty packed buffer of `values` values, x's per-sample scales): on `split` fp16, twice as many (hi and lo
    parts), with conv_x_scales; else fp32 and no scales."""
    if split:
        return torch.empty(2 * values, device=x.device, dtype=torch.float16), conv_x_scales(x)
    return torch.empty(values, device=x.device, dtype=torch.float32), None


def pack_rows(rows: int, cols: int) -> int:
    """Rows of a pack program over `cols` columns: 64 on a GPU; in the interpreter few, large programs
    (INTERPRETER_ELEMENTS)."""
    return min(triton.next_power_of_2(rows), INTERPRETER_ELEMENTS // cols) if SETTINGS.interpret else 64


def pack_im2col(x: torch.Tensor, geo: ConvGeometry, split: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(im2col rows, per-sample scales or None) for dense K: x (N, C_in, ...) as (M, groups, record), a record the
    KP = dense_columns(K) values of the pixel's window (split as pack_input's). Cost: x read once per tap (mostly
    from L2), M * groups * KP * 4 bytes written, which the tile reads once: 12 bytes an element of the window of a
    3-channel pixel, where pack_input writes 64 padded per input pixel."""
    kp = dense_columns(geo.K)
    out, scale = packed_buffer(x, geo.M * geo.groups * kp, split)
    block_k = DENSE_K_ALIGN.value
    block_p = pack_rows(geo.M, block_k)
    if out.numel():
        sizes = (geo.M, geo.C_in, geo.D, geo.H, geo.W, geo.OD, geo.OH, geo.OW, geo.CIN_G, geo.KD, geo.KH, geo.KW,
                 geo.SD, geo.SH, geo.SW, geo.PD, geo.PH, geo.PW, geo.DD, geo.DH, geo.DW, kp)
        conv_im2col_kernel[(cdiv(geo.M, block_p), geo.groups, kp // block_k)](
            x, out if scale is None else scale, out, *sizes, SPLIT=split, BLOCK_P=block_p, BLOCK_K=block_k)
    return out, scale


def pack_input(x: torch.Tensor, groups: int, split: bool,
               pad: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(packed x, per-sample scales or None): x (N, C_in, D, H, W) as (N, D, H, W, groups, record), a record the
    group's CP channels (zeros past CIN_G), so each pixel's channels are contiguous. On `split` ("fp16x3p") a
    record is the fp16 hi parts of x * s[n] (conv_x_scales) then the lo parts (4 bytes an element, as x's fp32),
    else x's fp32 values. `pad` = ((PD, PH, PW), (Dp, Hp, Wp)): the pixels laid out on a (Dp, Hp, Wp) grid at
    offset (PD, PH, PW), zero records around them (kernels/conv_sm90.py's wide rows). Cost: one read of x (two
    with the scales), one write."""
    n, c_in = x.shape[:2]
    dims = (1,) * (5 - x.dim()) + tuple(x.shape[2:])
    lead, grid = pad or ((0, 0, 0), dims)
    s = grid[0] * grid[1] * grid[2]
    cin_g = c_in // groups
    cp = packed_channels(cin_g)
    out, scale = packed_buffer(x, n * s * groups * cp, split)
    block_c = min(64, triton.next_power_of_2(cp))
    block_p = pack_rows(n * s, block_c)
    if out.numel():
        conv_pack_kernel[(cdiv(n * s, block_p), groups, cdiv(cp, block_c))](
            x, out if scale is None else scale, out, n * s, c_in, cin_g, *dims, *grid, *lead, SPLIT=split,
            BLOCK_P=block_p, BLOCK_C=block_c)
    return out, scale
