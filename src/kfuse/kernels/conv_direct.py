"""The direct convolution tile: a loop over a group's input channels and the kernel's taps on CUDA cores, no tl.dot.

For narrow groups (conv_geometry.direct_k: fewer than 8 input channels, input x output channels a group at most 512;
depthwise convolutions are the case of one input channel).
One program owns BLOCK_M output pixels and BLOCK_N output channels of group g. For each tap and input channel it
loads the (BLOCK_M,) input values that tap reads (contiguous along the output pixels at stride 1, masked to zero
outside the input: the zero padding) and the (BLOCK_N,) weights, and adds their outer product to the accumulator.
x is read as it is (NC(D)HW, no pack), the weight as (C_out, CIN_G * taps), the reshape of its own layout.

Why: the implicit-GEMM tile (kernels/conv.py) pads each tap's channels to 16 and walks one 16-deep K block a tap, so
a 3-channel 3 x 3 x 3 convolution costs 27 blocks of per-tap address arithmetic and 27 x 16 x 3 fp16 products a pixel
and channel for 81 real ones; on an H100 and an H200 that tile ran such convolutions at a tenth of the tensor cores'
rate, bound by building its A operand (benchmarks/conv/NOTES.md, "Dense K"). Here each loaded value feeds BLOCK_N
multiply-adds and the bounds checks are one per row and tap.

Precision (FP64): each fp32 pair multiplied exactly in float64 and the sum kept there, rounded to fp32 once: within
half an ulp of the exact convolution, so rule 3 holds by construction. Without FP64 (conv.py's "direct32", a GPU's
default): fp32 products and sums in (tap, channel) order, as eager's own fp32 convolution. On an H200 the float64
version took 2.7x the fp32 one's time (float64 runs at half fp32's rate and needs twice the registers), and the fp32
one's error against float64 was 0.96-1.32x strict cuDNN's on KernelBench's few-channel convolutions (rule 3 allows
2x): benchmarks/conv/NOTES.md, "The direct tile".

Cost of one tile: BLOCK_M * BLOCK_N * CIN_G * taps multiply-adds on CUDA cores (67 TFLOP/s fp32, 34 float64 on an
H100 or H200), BLOCK_M * CIN_G * taps loads of x (from L1/L2 after the first tap: neighbouring taps overlap), the
group's weight once.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def conv_direct_at(x_ptr, w_ptr, stride_wn, n_idx, od, oh, ow, mask_m, pid_n, g,
                   C_in, D, H, W, CIN_G, COUT_G, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP64: tl.constexpr):
    """The fp32 (BLOCK_M, BLOCK_N) accumulator (no bias) of output pixels (od[i], oh[i], ow[i]) of samples n_idx[i],
    where mask_m[i] (other rows hold zeros), and channels g * COUT_G + pid_n * BLOCK_N + j of group g (channels past
    the group read the last one's weights: the caller masks its store). x: NC(D)HW; w: (C_out, CIN_G * taps) rows
    `stride_wn` apart, each in (channel, kd, kh, kw) order."""
    id0 = od * SD - PD  # output pixel -> the input corner its window starts at (before the taps' offsets)
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    plane = D * H * W
    x_rows = x_ptr + (n_idx.to(tl.int64) * C_in + g * CIN_G) * plane
    offs_c = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = w_ptr + (g * COUT_G + tl.minimum(offs_c, COUT_G - 1)).to(tl.int64) * stride_wn  # clamped: in bounds
    taps = KD * KH * KW
    if FP64:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kd in range(KD):
        di = id0 + kd * DD
        in_d = mask_m & (di >= 0) & (di < D)
        for kh in range(KH):
            hh = ih0 + kh * DH
            in_dh = in_d & (hh >= 0) & (hh < H)
            for kw in range(KW):
                wi = iw0 + kw * DW
                inside = in_dh & (wi >= 0) & (wi < W)  # one bounds check a row and tap, for every channel
                a_ptrs = x_rows + (di * (H * W) + hh * W + wi)
                b_ptrs = w_rows + ((kd * KH + kh) * KW + kw)
                for _ in range(CIN_G):  # the pointers step a channel plane (x) and a channel's taps (w)
                    a = tl.load(a_ptrs, mask=inside, other=0.0)
                    b = tl.load(b_ptrs)
                    if FP64:  # the product of two fp32 values is exact in float64
                        acc += a.to(tl.float64)[:, None] * b.to(tl.float64)[None, :]
                    else:
                        acc += a.to(tl.float32)[:, None] * b.to(tl.float32)[None, :]
                    a_ptrs += plane
                    b_ptrs += taps
    return acc.to(tl.float32)
