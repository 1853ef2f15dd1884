"""What a `--backend cuda` ModelNew with a convolution carries besides the runtime (copied into it by name:
kfuse/library.py, CUDA_MODULES): the weight's rows as the convolution tile reads them, split once per weight version,
and the tile's launches for a geometry.

A launch is LAUNCH_FIELDS ints, one KfConvArgs of the C++ side (conv_operands_source.CONV_CPP, kf_conv_operands):
  - an ordinary convolution's 23 sizes (kfuse/kernels/conv_geometry.py, ConvGeometry.args): its rows M, the input's
    and its output pixels' sizes, the window (kernel, stride, padding, dilation);
  - where those output pixels land in the region's output: its dims FD, FH, FW, the first pixel's place RD, RH, RW
    and the step UD, UH, UW per dim;
  - col, the launch's first column in the weight's rows.
A convolution is one launch whose pixels land one to one (place 0, step 1, col 0) on rows (C_out, taps x CP), tap by
tap. A transposed convolution is one launch per stride phase with pixels (kfuse/kernels/conv_phases.py): phase r's
pixels t are an ordinary convolution of x at stride 1, leading padding -q and dilation -E over its nt taps, landing
at r + stride t; the weight's rows hold the phases' tap blocks in phase order, col the phase's. The phases partition
the taps, so no product with an inserted zero is done, and x is packed once for all of them.
"""

from __future__ import annotations

import torch

from kfuse.cuda.runtime import cached_on
from kfuse.kernels.conv_geometry import ConvGeometry
from kfuse.kernels.conv_phases import TransposedGeometry, phase_weight

CONV_CHANNELS = 8  # a group's input channels are padded to a multiple of this: one 16-byte copy of fp16 (conv_source)
LAUNCH_FIELDS = 33  # a launch's ints: 23 sizes, 9 for where its pixels land, its first weight column


def conv_channels(cin_g: int) -> int:
    """A group's input channels padded to CONV_CHANNELS: the width CP of its part of a record and a weight tap."""
    return -(-cin_g // CONV_CHANNELS) * CONV_CHANNELS


def conv_weight_rows(weight: torch.Tensor, cp: int) -> torch.Tensor:
    """A convolution's weight (C_out, C_in, *kernel) as the rows its CUDA tile reads: (C_out, taps x cp) fp32, tap
    by tap (row-major over the kernel's dims), each tap's C_in channels zero-padded to cp."""
    w = weight.detach().float().movedim(1, -1)
    w = torch.nn.functional.pad(w, (0, cp - w.shape[-1]))
    return w.reshape(w.shape[0], -1).contiguous()


def weight_parts(ext, weight: torch.Tensor, tag: tuple, rows, direct: bool) -> tuple:
    """(w, w_scale) from the weight's rows (`rows()`), kept on the weight until it changes (cached_on, under `tag`):
    split into [hi | lo] fp16 rows and per-row scales (split_rows) for the implicit-GEMM tile, the rows in float64
    (and no scales) for the direct tile."""
    if direct:  # float64: the tile's products are double FMAs (no conversion a load)
        return cached_on(weight, ("direct", *tag), lambda: rows().double()), None
    return cached_on(weight, tag, lambda: tuple(ext.split_rows(rows())))


def conv_parts(ext, weight: torch.Tensor, geo: ConvGeometry, direct: bool = False) -> tuple:
    """(w, w_scale, cp, launches) of a convolution: the weight's rows (conv_weight_rows) as the tile reads them
    (weight_parts), cp, and its one launch."""
    cp = conv_channels(geo.CIN_G)
    w, scale = weight_parts(ext, weight, ("conv", cp), lambda: conv_weight_rows(weight, cp), direct)
    return w, scale, cp, [*geo.args(), geo.OD, geo.OH, geo.OW, 0, 0, 0, 1, 1, 1, 0]


def phase_launches(geo: TransposedGeometry, cp: int) -> list[int]:
    """A transposed convolution's launches, one per stride phase with output pixels (a phase with none is left
    out; one with no tap, a stride longer than the dilated kernel, has K = 0: its bias and epilogue alone)."""
    launches: list[int] = []
    for rd, rh, rw, ntd, nth, ntw, qd, qh, qw, col in geo.phase_rows(cp):
        td, th, tw = (-(-(o - r) // s) for o, r, s in ((geo.OD, rd, geo.SD), (geo.OH, rh, geo.SH),
                                                         (geo.OW, rw, geo.SW)))
        if min(td, th, tw) <= 0:
            continue
        launches += [geo.N * td * th * tw, geo.C_in, geo.D, geo.H, geo.W, td, th, tw, geo.C_out, geo.CIN_G,
                     geo.COUT_G, ntd, nth, ntw, 1, 1, 1, -qd, -qh, -qw, -geo.ED, -geo.EH, -geo.EW,
                     geo.OD, geo.OH, geo.OW, rd, rh, rw, geo.SD, geo.SH, geo.SW, col]
    return launches


def conv_transpose_parts(ext, weight: torch.Tensor, geo: TransposedGeometry, direct: bool = False) -> tuple:
    """(w, w_scale, cp, launches) of a transposed convolution: the phase-ordered rows (phase_weight) as the tile
    reads them (weight_parts; kept per version and phases), cp, the phases' launches (phase_launches)."""
    cp = conv_channels(geo.CIN_G)
    w, scale = weight_parts(ext, weight, ("conv_transpose", cp, geo.phases), lambda: phase_weight(weight, geo, cp),
                            direct)
    return w, scale, cp, phase_launches(geo, cp)
