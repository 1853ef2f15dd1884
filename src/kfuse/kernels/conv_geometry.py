"""Every convolution as a 3-d one: its sizes (ConvGeometry, from torch's argument forms by conv_geometry) and whether
its tile runs dense K (dense_k) or the direct loop (direct_k). Plain Python: kernels/conv_pack.py packs the operands
for a geometry, kernels/conv.py tiles it (kernels/conv_direct.py for the direct loop)."""

from __future__ import annotations

import dataclasses
import os

# Dense K: where a group has fewer input channels than this, padding each tap's channels to 16 would multiply the
# tensor-core work by 16 / CIN_G (5.3x for 3 channels, and one 16-deep K block per tap: 27 on a 3 x 3 x 3 kernel,
# each with its own bounds checks). Such a convolution packs im2col rows (pack_im2col) and the tile walks them as a
# plain GEMM (conv_tile_at). 8 channels stay padded: on an H100 the 8-channel Conv2d problems already ran 1.5-3.9x
# eager's speed padded, the 3-channel Conv3d ones 0.48-0.97x (benchmarks/conv/NOTES.md). (Gathering each K block's
# (tap, channel) pairs in the tile instead, from unpadded records, was 1.2-1.3x slower than padding on an H200.)
DENSE_BELOW = 8
# KFUSE_CONV_DENSE=1 turns dense K on (read once, when the module loads): on an H200 its GEMM ran 2.4-4.7x faster
# than the padded walk, but the pack cost as much (problem 23 7% faster, 24 22% slower), so it is off by default.
# Here, not in runtime.Settings: only conv files carry it.
DENSE_ON = os.environ.get("KFUSE_CONV_DENSE", "0") == "1"


def dense_k(cin_g: int) -> bool:
    """Does a convolution with `cin_g` input channels a group run dense K (DENSE_BELOW, DENSE_ON)?"""
    return DENSE_ON and cin_g < DENSE_BELOW


# The direct tile (kernels/conv_direct.py): a convolution whose groups are narrow runs as a loop over its channels and
# taps on CUDA cores, from x as it is (no pack) and the weight as it is: per (channel, tap) one load of the tile's
# pixels and one of its channels' weights, their outer product added to the accumulator (fp32 on a GPU, float64 in
# the interpreter). A 3-channel 3 x 3 x 3 convolution then does its 81 real products a pixel and channel, not the
# padded tile's 27 x 16 x 3 fp16 products behind 27 per-tap blocks of address arithmetic. Its cost grows with the
# multiply-adds a pixel and tap, CIN_G x COUT_G (COUT_G rounded up to a power of two, as its column tiles), the
# padded tile's hardly at all at these sizes. On an H200, over a grid of channel counts (benchmarks/conv/
# direct_grid.py; NOTES.md, "The direct tile") the direct tile won everywhere up to 256 (1.3-12x faster), went either
# way at 384 and 512 (0.71-1.20x its time) and lost from 768 on (1.09-3.1x); at KernelBench's full sizes its
# convolution alone won 1.6-3.8x on 3 -> 16/24/64 channels and 8 -> 16. But a whole problem of 8 channels a group
# lost: level 2 problem 8 (8 -> 16, a pool after the conv) took 5.63 ms against the GEMM tile's 4.5, 7 (8 -> 32)
# 5.75 against eager's 5.43. So the direct tile takes groups of fewer than DIRECT_BELOW channels whose product is at
# most DIRECT_WORK (3 -> 128 and 6 -> 64 in, 6 -> 128 out).
DIRECT_BELOW = 8
DIRECT_WORK = 512
# KFUSE_CONV_DIRECT (read once, when the module loads; here, not in runtime.Settings: only conv files carry it):
# "0" turns the direct tile off, "64" sums in float64 on a GPU too (conv.conv_scheme). Dense K, where turned on,
# comes first: it is the explicit choice.
DIRECT_ON = os.environ.get("KFUSE_CONV_DIRECT", "1") != "0"
DIRECT_FP64 = os.environ.get("KFUSE_CONV_DIRECT", "1") == "64"
# stride-1 convolutions on a Hopper GPU run kernels/conv_sm90.py's Gluon tile unless KFUSE_CONV_SM90=0
SM90_ON = os.environ.get("KFUSE_CONV_SM90", "1") != "0"


def direct_k(cin_g: int, cout_g: int) -> bool:
    """Does a convolution with `cin_g` input and `cout_g` output channels a group run on the direct tile
    (DIRECT_BELOW, DIRECT_WORK, DIRECT_ON)?"""
    work = cin_g * (1 << max(cout_g - 1, 0).bit_length())
    return DIRECT_ON and cin_g < DIRECT_BELOW and work <= DIRECT_WORK and not dense_k(cin_g)


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """One convolution's sizes, as a 3-d one (1-d and 2-d: unit leading spatial dims). The fields from M to DW are
    the kernels' size arguments, in order (args())."""

    M: int  # output pixels: N * OD * OH * OW
    C_in: int
    D: int
    H: int
    W: int
    OD: int
    OH: int
    OW: int
    C_out: int
    CIN_G: int  # input channels per group
    COUT_G: int  # output channels per group
    KD: int
    KH: int
    KW: int
    SD: int
    SH: int
    SW: int
    PD: int  # leading (left) padding; the trailing one is implied by the output size (masking)
    PH: int
    PW: int
    DD: int
    DH: int
    DW: int
    groups: int
    out_shape: tuple[int, ...]  # the output's shape at the input's rank

    def args(self) -> tuple[int, ...]:
        return tuple(dataclasses.astuple(self)[:23])

    @property
    def K(self) -> int:
        return self.CIN_G * self.KD * self.KH * self.KW

    @property
    def dense(self) -> bool:
        """Whether the tile runs dense K (dense_k): a group's few channels packed as im2col rows (conv_pack)."""
        return dense_k(self.CIN_G)

    @property
    def stride1(self) -> bool:
        return self.SD == self.SH == self.SW == 1

    @property
    def wide_pixels(self) -> int:
        """The padded input's pixels at stride 1 (kernels/conv_sm90.py's wide rows): N * Dp * Hp * Wp."""
        dp, hp, wp = self.wide_pad()[1]
        return (self.M // (self.OD * self.OH * self.OW) if self.M else 0) * dp * hp * wp

    def wide_pad(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """pack_input's `pad` for wide rows: the leading padding and the padded input's dims (Dp, Hp, Wp)."""
        return ((self.PD, self.PH, self.PW), (self.OD + self.DD * (self.KD - 1), self.OH + self.DH * (self.KH - 1),
                                              self.OW + self.DW * (self.KW - 1)))

    @property
    def direct(self) -> bool:
        """Whether the convolution runs on the direct tile (direct_k): narrow groups, CUDA cores, no pack."""
        return direct_k(self.CIN_G, self.COUT_G)


def _triple(v, dims: int, fill: int, what: str) -> tuple[int, int, int]:
    """An int or a tuple of `dims` ints, padded in front with `fill` to three."""
    vals = (int(v),) * dims if isinstance(v, int) else tuple(int(x) for x in v)
    if len(vals) == 1 and dims > 1:
        vals = vals * dims
    if len(vals) != dims:
        raise ValueError(f"conv: {what} {v!r} for a {dims}-d convolution")
    return (fill,) * (3 - dims) + vals


def stride1_padding(kernel: tuple[int, ...], stride, padding, output_padding, dilation) -> tuple[int, ...] | None:
    """The padding of the convolution a ConvTranspose is at stride 1 without output padding: dilation * (K - 1) -
    padding per spatial dim (output pixel o reads input o + padding - k * dilation for tap k); None for any other
    geometry, or where that padding would be negative."""
    dims = len(kernel)
    st, pad, out_pad, dil = (_triple(v, dims, 0, what)[3 - dims:] for v, what in (
        (stride, "stride"), (padding, "padding"), (output_padding, "output_padding"), (dilation, "dilation")))
    pads = tuple(d * (k - 1) - p for d, k, p in zip(dil, kernel, pad))
    return pads if all(s == 1 for s in st) and not any(out_pad) and min(pads) >= 0 else None


def conv_pads(padding, kernel: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(leading, trailing) zero padding per spatial dim. 'same': total dilation * (k - 1), the odd one out trailing,
    as torch pads; 'valid': none; ints or tuples: the same on both sides."""
    dims = len(kernel)
    if padding == "valid":
        return (0,) * dims, (0,) * dims
    if padding == "same":
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple(t // 2 for t in total), tuple(t - t // 2 for t in total)
    lead = _triple(padding, dims, 0, "padding")[3 - dims:]
    return lead, lead


def conv_geometry(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride, padding, dilation,
                  groups: int) -> ConvGeometry:
    """The geometry of conv{1,2,3}d(x, w, stride, padding, dilation, groups) with torch's argument forms."""
    dims = len(x_shape) - 2
    if dims not in (1, 2, 3) or len(w_shape) != dims + 2:
        raise ValueError(f"conv: input {tuple(x_shape)} and weight {tuple(w_shape)}")
    n, c_in, *spatial = x_shape
    c_out, cin_g, *kernel = w_shape
    if c_in != cin_g * groups or c_out % groups:
        raise ValueError(f"conv: {c_in} input and {c_out} output channels in {groups} groups, weight {tuple(w_shape)}")
    st = _triple(stride, dims, 1, "stride")
    dl = _triple(dilation, dims, 1, "dilation")
    lead, trail = conv_pads(padding, tuple(kernel), dl[3 - dims:])
    out = [(i + a + b - d * (k - 1) - 1) // s + 1
           for i, a, b, d, k, s in zip(spatial, lead, trail, dl[3 - dims:], kernel, st[3 - dims:])]
    if any(o <= 0 for o in out):
        raise ValueError(f"conv: input {tuple(x_shape)} is smaller than the kernel {tuple(kernel)}")
    sp3 = (1,) * (3 - dims) + tuple(spatial)
    out3 = (1,) * (3 - dims) + tuple(out)
    k3 = (1,) * (3 - dims) + tuple(kernel)
    pad3 = (0,) * (3 - dims) + tuple(lead)
    return ConvGeometry(n * out3[0] * out3[1] * out3[2], c_in, *sp3, *out3, c_out, cin_g, c_out // groups, *k3,
                        *st, *pad3, *dl, groups, (n, c_out, *out))
