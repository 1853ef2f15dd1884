"""fp32-accurate transposed convolutions (ConvTranspose1d/2d/3d) as stride-phase implicit GEMMs on conv.py's tile.

ConvTranspose forward, NC(D)HW contiguous fp32 input x (N, C_in, D, H, W), weight (C_in, C_out/groups, KD, KH, KW),
any stride, padding, output_padding, dilation and groups, with or without bias; 1-d and 2-d as 3-d with unit dims.

Gather form, no zero-inserted input. Output pixel o (per spatial dim) reads input i = (o + pad - k * dil) / stride for
each kernel tap k where that division is exact and 0 <= i < I. Write o = r + stride * t (r the output's stride PHASE,
0 <= r < stride): whether a tap divides exactly depends on r alone, not on t. So per phase the taps that contribute
are fixed, k = k0 + j * step (step = stride / gcd(stride, dil), j < nt), and their input is
    i = t + q - j * E,        q = (r + pad - k0 * dil) / stride,   E = dil / gcd(stride, dil)
which is an ordinary convolution over t: stride 1, leading padding -q, dilation -E, nt taps. Each phase is therefore
one dense implicit GEMM (conv.py's conv_tile on its packed operands: x packed by pack_input): rows the phase's
output pixels (n, td, th, tw), K = ntd * nth * ntw taps of CP packed channels. The phases partition the kernel
taps, so the GEMMs together do exactly the convolution's useful products (N * D*H*W * C_in * C_out/groups *
KD*KH*KW multiply-adds, less the taps that fall outside the input at the borders, plus the channels' padding to
CP), never a product with an inserted zero. A phase with no tap (stride larger than the dilated kernel) gets K = 0:
the bias and epilogue alone.

One launch: program_id(2) is the phase (SD * SH * SW of them), program_id(1) the group, program_id(0) the row and
column tile as in conv.py. Rows are counted for the largest phase (phase 0); a tile past its phase's rows skips
its K loop and stores nothing.

Weight preparation, once per weight version and geometry (cached_phase_weight): the weight rearranged into a (C_out,
K_total) GEMM operand whose columns are the phases' blocks in phase order, each block (jd, jh, jw, ci) row-major
with the channels zero-padded to CP (conv.py's packed weight), so conv_tile reads phase P's block at column offset
col_P with the row stride of the whole matrix. It holds each weight element once (the phases partition the taps). On
"fp16x3p" it is split like conv.py's weight (split_weight: one power of two per output channel over the channel's
whole row, so every phase shares it). The per-phase integers (phase offsets, tap counts, q, col_P) are a small int32
table on the device (phase_table), cached per geometry and device, so a CUDA graph capture never builds one.

Cost of one call: 2 * N*D*H*W * C_in * C_out/groups * KD*KH*KW flops at most (three fp16 products on "fp16x3p");
bytes: x packed first (conv.py's pack_input: read twice, its packed copy written), the packed copy read once from
memory (reused across taps from L1/L2), the weight's hi + lo (4 B per element) once per row tile, the output written
once. Stores are strided by the stride along W within a phase (a phase's pixels are
every stride-th one), so at stride 2 half of each stored sector is another phase's.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from kfuse.kernels.conv import conv_scheme, conv_tile, conv_tile_ids
from kfuse.kernels.conv_config import ConvConfig, conv_config
from kfuse.kernels.conv_geometry import stride1_padding
from kfuse.kernels.conv_pack import cached_parts, pack_input, packed_channels
from kfuse.kernels.conv_phases import TransposedGeometry, conv_transpose_geometry, phase_weight
from kfuse.kernels.gemm_core import cdiv, split_weight
from kfuse.kernels.runtime import SETTINGS, tensor_key


# ----------------------------------------------------------------------------------------------------------------
# the operands: the phase-ordered weight (split on fp16x3p), the phase table (the geometry: kernels/conv_phases.py)
# ----------------------------------------------------------------------------------------------------------------
def _weight_parts(weight: torch.Tensor, geo: TransposedGeometry, split: bool) -> tuple:
    """(w, w_lo, w_scale or None, stride_wn) of the phase-ordered weight: its fp16 hi/lo split (split_weight's
    views of one buffer) and per-channel powers of two, or the fp32 matrix alone."""
    wp = phase_weight(weight, geo, packed_channels(geo.CIN_G))
    if not split:
        return wp, wp, None, wp.stride(0)
    w_hi, w_lo, w_scale = split_weight(wp)
    return w_hi, w_lo, w_scale, w_hi.stride(0)


def cached_phase_weight(weight: torch.Tensor, geo: TransposedGeometry, split: bool) -> tuple:
    """_weight_parts, made once per version of the weight and per taps of the geometry (stride, padding, dilation,
    kernel: geo.phases; conv_pack.cached_parts)."""
    return cached_parts(weight, "_kfuse_conv_transpose", (tensor_key(weight), geo.phases, split),
                     lambda: _weight_parts(weight, geo, split))


@functools.lru_cache(maxsize=256)
def _phase_table(rows: tuple[tuple[int, ...], ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1)


def phase_table(geo: TransposedGeometry, device: torch.device) -> torch.Tensor:
    """The per-phase integers (PHASE_FIELDS per phase, int32) on `device`, one tensor per geometry and device."""
    return _phase_table(tuple(geo.phase_rows(packed_channels(geo.CIN_G))), device)


def conv_transpose_plan(x: torch.Tensor, weight: torch.Tensor, stride, padding, output_padding, groups: int,
                        dilation, scheme: str | None = None) -> tuple:
    """(geo, scheme, cfg, ops, sizes) for one launch of a conv_transpose_tile kernel on contiguous x: geometry,
    scheme (conv.py's conv_scheme unless given), tile config (conv.py's conv_config on the largest phase), operand
    tensors (x, w, w_lo, w_scale, x_scale, phase table) and size arguments (stride_wn, then geo.args()). A
    parameter's phase-ordered weight is cached (cached_phase_weight); any other weight is rebuilt on every call."""
    geo = conv_transpose_geometry(tuple(x.shape), tuple(weight.shape), stride, padding, output_padding, groups,
                                  dilation)
    scheme = scheme or conv_scheme(x)
    split = scheme == "fp16x3p"
    cfg = conv_transpose_config(geo, scheme, SETTINGS.interpret)
    parts = cached_phase_weight(weight, geo, split) if isinstance(weight, torch.nn.Parameter) else _weight_parts(
        weight, geo, split)
    w, w_lo, w_scale, stride_wn = parts
    xp, x_scale = pack_input(x, geo.groups, split)
    ops = (xp, w, w_lo, xp if w_scale is None else w_scale, xp if x_scale is None else x_scale,
           phase_table(geo, x.device))
    return geo, scheme, cfg, ops, (stride_wn, *geo.args())


def conv_transpose_config(geo: TransposedGeometry, scheme: str, interpret: bool) -> ConvConfig:
    """conv.py's conv_config on the largest phase's GEMM (it reads M, K and COUT_G), with 16-deep K blocks on a GPU
    where the column tile is 128 wide: at 64 x 128 x 32 (4 warps) this kernel spilled 112 bytes on fp16x3p (and 48
    on ieee) in ptxas for sm_90, its phase bookkeeping on top of conv's tile at the 255-register cap; 64 x 128 x 16
    has no spill (tests/test_conv_transpose_kernel.py). The plain transposed region's launch tunes it (conv.py's
    tuned_conv: on an H200 a tuner candidate beat this default on 11 of 12 KernelBench transposed convolutions, by up
    to 21%, benchmarks/conv/NOTES.md "The transposed tile's config"); the other kinds' launches run it as it is (at the
    best candidate's 128 x 64 x 32 their sm_90 builds spill more: 328 bytes in the GroupNorm kind's stats kernel)."""
    cfg = conv_config(geo, scheme, interpret)
    if not interpret and cfg.block_n >= 128:
        return dataclasses.replace(cfg, block_k=16)
    return cfg


def conv_transpose_grid(geo: TransposedGeometry, cfg: ConvConfig) -> tuple[int, int, int]:
    """(row tiles of the largest phase x column tiles of a group, groups, phases)."""
    return cdiv(geo.M, cfg.block_m) * cdiv(geo.COUT_G, cfg.block_n), geo.groups, geo.n_phases


def _as_conv_weight(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """(C_in, C_out/g, K...) -> (C_out, C_in/g, K...), each group's block transposed, the taps reversed."""
    c_in, cout_g, *k = weight.shape
    w = weight.detach().reshape(groups, c_in // groups, cout_g, *k).transpose(1, 2)
    return w.reshape(groups * cout_g, c_in // groups, *k).flip(list(range(2, 2 + len(k)))).contiguous()


def transposed_as_conv(weight: torch.Tensor, stride, padding, output_padding, groups: int, dilation) -> tuple:
    """(weight', stride, padding', dilation, groups) for conv_plan: a ConvTranspose at stride 1 without output
    padding is the convolution, at padding d * (K - 1) - p, with each group's weight block transposed and its taps
    reversed (output pixel o reads input o + p - k * d for tap k). The generated file chose this form from the
    module's geometry when it was written (regions/conv_common.as_convolution); other geometry is refused here. A
    parameter's weight' is made once per version of it (conv_pack.cached_parts), a Parameter without gradient so that
    conv_plan caches its split on it too (the backward recomputes from the module's own weight)."""
    dims = weight.dim() - 2
    pads = stride1_padding(tuple(weight.shape[2:]), stride, padding, output_padding, dilation)
    if pads is None:
        raise ValueError(f"kfuse: this ModelNew runs its ConvTranspose as a stride-1 convolution, the geometry it was "
                         f"generated for; now stride {stride}, padding {padding}, output_padding {output_padding}: "
                         f"regenerate it with `kfuse optimize`")
    if isinstance(weight, torch.nn.Parameter):
        w = cached_parts(weight, "_kfuse_as_conv", (tensor_key(weight), groups),
                         lambda: torch.nn.Parameter(_as_conv_weight(weight, groups), requires_grad=False))
    else:
        w = _as_conv_weight(weight, groups)
    return w, (1,) * dims, pads, dilation, groups


# ----------------------------------------------------------------------------------------------------------------
# the tile
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def conv_transpose_tile(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, phase_ptr, stride_wn, pid_m, pid_n, g,
                        N, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G, SD, SH, SW, ED, EH, EW,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCHEME: tl.constexpr):
    """(acc, row offsets, row mask) of output rows pid_m * BLOCK_M + i of phase program_id(2) and channels
    g * COUT_G + pid_n * BLOCK_N + j: the fp32 accumulator (no bias), each row's offset in the NC(D)HW output at
    channel 0 (add channel * OD*OH*OW), and which rows exist. The phase is a convolution over its own pixels t:
    conv_tile at stride 1, leading padding -q, dilation -E, its tap counts, its weight block at column `col`."""
    row = phase_ptr + tl.program_id(2) * 10  # PHASE_FIELDS
    rd = tl.load(row)
    rh = tl.load(row + 1)
    rw = tl.load(row + 2)
    ntd = tl.load(row + 3)
    nth = tl.load(row + 4)
    ntw = tl.load(row + 5)
    col = tl.multiple_of(tl.load(row + 9), 16)  # phase blocks start at multiples of CP: aligned weight loads
    # the phase's output pixels per dim: r, r + s, ... below O (at least 1 for the index math; M is then 0)
    td = tl.maximum((OD - rd + SD - 1) // SD, 1)
    th = tl.maximum((OH - rh + SH - 1) // SH, 1)
    tw = tl.maximum((OW - rw + SW - 1) // SW, 1)
    M = N * ((OD - rd + SD - 1) // SD) * ((OH - rh + SH - 1) // SH) * ((OW - rw + SW - 1) // SW)
    if pid_m * BLOCK_M < M:
        acc = conv_tile(x_ptr, w_ptr + col, w_lo_ptr + col, w_scale_ptr, x_scale_ptr, stride_wn, pid_m, pid_n, g,
                        M, C_in, D, H, W, td, th, tw, C_out, CIN_G, COUT_G, ntd, nth, ntw, 1, 1, 1,
                        -tl.load(row + 6), -tl.load(row + 7), -tl.load(row + 8), -ED, -EH, -EW,
                        BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, False)  # phases keep padded K (pack_input's default)
    else:  # a row tile past this phase's pixels: nothing to compute, nothing stored
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    S_t = td * th * tw
    n_idx = offs_m // S_t
    sp = offs_m % S_t
    od = rd + (sp // (th * tw)) * SD
    oh = rh + ((sp // tw) % th) * SH
    ow = rw + (sp % tw) * SW
    rows = n_idx.to(tl.int64) * C_out * (OD * OH * OW) + (od * (OH * OW) + oh * OW + ow)
    return acc, rows, offs_m < M


# ----------------------------------------------------------------------------------------------------------------
# the plain transposed convolution (+ bias), for tests and direct use
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def conv_transpose_bias_kernel(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, phase_ptr, bias_ptr, out_ptr,
                               stride_wn, N, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G, SD, SH, SW, ED, EH, EW,
                               HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, SCHEME: tl.constexpr):
    """out = conv_transpose(x, w) + bias, NC(D)HW. Bytes: x read once, w once per row tile, out written once."""
    pid_m, pid_n, g = conv_tile_ids(COUT_G, BLOCK_N)
    acc, rows, mask_m = conv_transpose_tile(x_ptr, w_ptr, w_lo_ptr, w_scale_ptr, x_scale_ptr, phase_ptr, stride_wn,
                                            pid_m, pid_n, g, N, C_in, D, H, W, OD, OH, OW, C_out, CIN_G, COUT_G,
                                            SD, SH, SW, ED, EH, EW, BLOCK_M, BLOCK_N, BLOCK_K, SCHEME)
    offs_c = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = g * COUT_G + offs_c
    mask = mask_m[:, None] & (offs_c < COUT_G)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=offs_c < COUT_G, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] + (offs_n.to(tl.int64) * (OD * OH * OW))[None, :], acc, mask=mask)


def conv_transpose_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1,
                           padding=0, output_padding=0, groups: int = 1, dilation=1, scheme: str | None = None,
                           cfg: ConvConfig | None = None) -> torch.Tensor:
    """conv_transpose{1,2,3}d(x, weight, bias, stride, padding, output_padding, groups, dilation) by
    conv_transpose_bias_kernel; no autograd. `scheme`: None for conv_scheme's; `cfg`: None for conv_config's."""
    x = x.contiguous()
    geo, scheme, default_cfg, ops, sizes = conv_transpose_plan(x, weight, stride, padding, output_padding, groups,
                                                               dilation, scheme)
    cfg = cfg or default_cfg
    out = torch.empty(geo.out_shape, device=x.device, dtype=x.dtype)
    if out.numel():
        conv_transpose_bias_kernel[conv_transpose_grid(geo, cfg)](
            *ops, out if bias is None else bias, out, *sizes, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SCHEME=scheme, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages)
    return out


def conv_transpose_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1, padding=0,
                       output_padding=0, groups: int = 1, dilation=1) -> torch.Tensor:
    """Plain torch reference (computes in x's dtype: pass float64 tensors for the accuracy reference)."""
    fn = {3: torch.nn.functional.conv_transpose1d, 4: torch.nn.functional.conv_transpose2d,
          5: torch.nn.functional.conv_transpose3d}[x.dim()]
    return fn(x, weight, bias, stride, padding, output_padding, groups, dilation)
