"""A pool's geometry over a convolution's output (no Triton: the CUDA backend's generated files read it too)."""

from __future__ import annotations

import dataclasses

from kfuse.kernels.conv_geometry import ConvGeometry, _triple


@dataclasses.dataclass(frozen=True)
class PoolGeometry:
    """A pool over a conv output, as a 3-d one (unit leading dims for 1-d and 2-d). Fields M to DW are the kernels'
    pool size arguments, in order (args())."""

    M: int  # pooled pixels: N * QD * QH * QW
    QD: int  # pooled output sizes
    QH: int
    QW: int
    KD: int  # window
    KH: int
    KW: int
    SD: int
    SH: int
    SW: int
    PD: int
    PH: int
    PW: int
    DD: int
    DH: int
    DW: int
    out_shape: tuple[int, ...]

    def args(self) -> tuple[int, ...]:
        return tuple(dataclasses.astuple(self)[:16])


def pooled_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """Output size of a pool along one dim, as torch's pooling_output_shape computes it."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside the input or its left pad
        out -= 1
    return out


def pool_geometry(geo: ConvGeometry, kernel_size, stride, padding, dilation, ceil_mode: bool) -> PoolGeometry:
    """The geometry of a pool (torch's argument forms; stride None or () = the window) over conv `geo`'s output."""
    dims = len(geo.out_shape) - 2
    k = _triple(kernel_size, dims, 1, "pool kernel_size")
    s = k if stride is None or stride == () or stride == [] else _triple(stride, dims, 1, "pool stride")
    p = _triple(padding, dims, 0, "pool padding")
    d = _triple(dilation, dims, 1, "pool dilation")
    if any(2 * pi > ki for pi, ki in zip(p, k)):
        raise ValueError(f"pool: padding {padding} should be at most half of the kernel size {kernel_size}")
    sizes = (geo.OD, geo.OH, geo.OW)
    q = tuple(pooled_size(*a, ceil_mode) for a in zip(sizes, k, s, p, d))
    if any(qi <= 0 for qi in q):
        raise ValueError(f"pool: conv output {geo.out_shape} is smaller than the window {kernel_size}")
    n = geo.out_shape[0]
    return PoolGeometry(n * q[0] * q[1] * q[2], *q, *k, *s, *p, *d, (n, geo.C_out, *q[3 - dims:]))
