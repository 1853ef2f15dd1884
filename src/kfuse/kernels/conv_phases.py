"""A transposed convolution's geometry as stride phases, each an ordinary convolution (plain Python and torch: both
backends' transposed tiles read it; kernels/conv_transpose.py's docstring derives the phases).

Output pixel o (per spatial dim) reads input i = (o + pad - k * dil) / stride for each kernel tap k where that
division is exact. Write o = r + stride * t (r the output's phase): whether a tap divides exactly depends on r alone,
so per phase the taps are k = k0 + j * step (j < nt) and their input is i = t + q - j * E, an ordinary convolution
over t at stride 1, leading padding -q, dilation -E and nt taps. The phases partition the taps: together they do
the convolution's useful products, never one with an inserted zero.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kfuse.kernels.conv_geometry import _triple

PHASE_FIELDS = 10  # a phase row: rd, rh, rw, ntd, nth, ntw, qd, qh, qw, col


@dataclasses.dataclass(frozen=True)
class DimPhases:
    """One spatial dim's phases: for output phase r (0 <= r < stride), the first contributing tap k0[r], the
    number of taps nt[r] (each `step` apart), and q[r], the input index of tap k0 at t = 0. E: the input's step
    between consecutive taps of a phase (dil / gcd(stride, dil))."""

    k0: tuple[int, ...]
    nt: tuple[int, ...]
    q: tuple[int, ...]
    step: int
    E: int


def dim_phases(stride: int, pad: int, dil: int, k: int) -> DimPhases:
    """Tap k contributes to output o = r + stride * t when (r + pad - k * dil) is a multiple of stride."""
    g = math.gcd(stride, dil)
    k0, nt, q = [], [], []
    for r in range(stride):
        taps = [kk for kk in range(k) if (r + pad - kk * dil) % stride == 0]
        k0.append(taps[0] if taps else 0)
        nt.append(len(taps))
        q.append((r + pad - k0[-1] * dil) // stride)  # exact where taps exist; unused where nt = 0
    return DimPhases(tuple(k0), tuple(nt), tuple(q), stride // g, dil // g)


@dataclasses.dataclass(frozen=True)
class TransposedGeometry:
    """One transposed convolution's sizes, as a 3-d one (1-d and 2-d: unit leading dims). The fields from N to EW
    are the kernels' size arguments after stride_wn, in order (args())."""

    N: int
    C_in: int
    D: int
    H: int
    W: int
    OD: int
    OH: int
    OW: int
    C_out: int
    CIN_G: int  # input channels per group (the weight's dim 0 is C_in)
    COUT_G: int  # output channels per group (the weight's dim 1)
    SD: int
    SH: int
    SW: int
    ED: int  # input step between a phase's consecutive taps, per dim
    EH: int
    EW: int
    groups: int
    kernel: tuple[int, int, int]
    phases: tuple[DimPhases, DimPhases, DimPhases]  # d, h, w
    out_shape: tuple[int, ...]

    def args(self) -> tuple[int, ...]:
        return tuple(dataclasses.astuple(self)[:17])

    @property
    def n_phases(self) -> int:
        return self.SD * self.SH * self.SW

    @property
    def M(self) -> int:
        """Rows of the largest phase (phase 0: ceil(O / stride) pixels per dim); the grid's row count."""
        return self.N * -(-self.OD // self.SD) * -(-self.OH // self.SH) * -(-self.OW // self.SW)

    @property
    def dense(self) -> bool:
        """Never dense K (conv.py's dense_k): the phases' weight blocks are padded per tap."""
        return False

    @property
    def K(self) -> int:
        """The largest phase's K (conv_config's block_k guess)."""
        return self.CIN_G * max(self.phases[0].nt) * max(self.phases[1].nt) * max(self.phases[2].nt)

    def phase_rows(self, cp: int) -> list[tuple[int, ...]]:
        """The phases' rows (PHASE_FIELDS ints each), phase P = (rd * SH + rh) * SW + rw, its weight block at column
        `col` of phase_weight's operand with a group's channels padded to `cp`."""
        rows, col = [], 0
        pd, ph, pw = self.phases
        for rd in range(self.SD):
            for rh in range(self.SH):
                for rw in range(self.SW):
                    nts = (pd.nt[rd], ph.nt[rh], pw.nt[rw])
                    rows.append((rd, rh, rw, *nts, pd.q[rd], ph.q[rh], pw.q[rw], col))
                    col += cp * nts[0] * nts[1] * nts[2]
        return rows


def conv_transpose_geometry(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride, padding, output_padding,
                            groups: int, dilation) -> TransposedGeometry:
    """The geometry of conv_transpose{1,2,3}d(x, w, stride, padding, output_padding, groups, dilation) (torch's
    argument order and forms: ints or tuples). Output size per dim: (I - 1) * s - 2 p + d (k - 1) + op + 1."""
    dims = len(x_shape) - 2
    if dims not in (1, 2, 3) or len(w_shape) != dims + 2:
        raise ValueError(f"conv_transpose: input {tuple(x_shape)} and weight {tuple(w_shape)}")
    n, c_in, *spatial = x_shape
    w_in, cout_g, *kernel = w_shape
    if w_in != c_in or c_in % groups:
        raise ValueError(f"conv_transpose: {c_in} input channels in {groups} groups, weight {tuple(w_shape)}")
    st, pad, op, dl = (_triple(v, dims, f, what) for v, f, what in ((stride, 1, "stride"), (padding, 0, "padding"),
                                                                     (output_padding, 0, "output_padding"),
                                                                     (dilation, 1, "dilation")))
    sp3, k3 = (1,) * (3 - dims) + tuple(spatial), (1,) * (3 - dims) + tuple(kernel)
    if any(o >= max(s, d) for o, s, d in zip(op, st, dl)):
        raise ValueError(f"conv_transpose: output_padding {output_padding!r} not below stride or dilation")
    out = [(i - 1) * s - 2 * p + d * (k - 1) + o + 1 for i, s, p, d, k, o in zip(sp3, st, pad, dl, k3, op)]
    if any(o <= 0 for o in out):
        raise ValueError(f"conv_transpose: output size {out[3 - dims:]} from input {tuple(x_shape)}")
    phases = tuple(dim_phases(s, p, d, k) for s, p, d, k in zip(st, pad, dl, k3))
    return TransposedGeometry(n, c_in, *sp3, *out, cout_g * groups, c_in // groups, cout_g, *st,
                              *(ph.E for ph in phases), groups, k3, phases, (n, cout_g * groups, *out[3 - dims:]))


def phase_weight(weight: torch.Tensor, geo: TransposedGeometry, cp: int) -> torch.Tensor:
    """(C_in, C_out/g, KD, KH, KW) -> the (C_out, K_total) fp32 operand: per output channel, the phases' tap
    blocks in phase order, each (jd, jh, jw, ci) row-major with tap k = k0 + j * step, a group's channels
    zero-padded to `cp` (the backend's padded channel count)."""
    kd, kh, kw = geo.kernel
    w = weight.detach().float().reshape(geo.groups, geo.CIN_G, geo.COUT_G, kd, kh, kw).transpose(1, 2)
    w = w.reshape(geo.C_out, geo.CIN_G, kd, kh, kw)
    taps = [[list(range(ph.k0[r], ph.k0[r] + ph.nt[r] * ph.step, ph.step)) for r in range(len(ph.nt))]
            for ph in geo.phases]
    pad = cp - geo.CIN_G
    blocks = [torch.nn.functional.pad(w[:, :, taps[0][rd]][:, :, :, taps[1][rh]][:, :, :, :, taps[2][rw]]
                                      .permute(0, 2, 3, 4, 1), (0, pad)).reshape(geo.C_out, -1)
              for rd in range(geo.SD) for rh in range(geo.SH) for rw in range(geo.SW)]
    return torch.cat(blocks, dim=1).contiguous()
