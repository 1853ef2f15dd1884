"""The fixed CUDA of `--backend cuda`'s direct convolution tile (kfuse/cuda/conv.py picks it per region): a
convolution whose groups are narrow, depthwise ones among them, as exact fp32 products summed in double on the CUDA
cores, from x as it is (NC(D)HW fp32: no pack) and the weight's rows in float64 (runtime.conv_weight_rows, or a
transposed convolution's phase-ordered rows, each tap's channels padded to CP), through the same launches
(kfuse/cuda/conv_runtime.py) and epilogue functor as the implicit-GEMM tile (conv_source.py).

  kf_conv_direct_kernel<NB, PX>  blocks of 128 threads, a thread PX output pixels of the launch (128 apart, so each
                       load of x is coalesced along the pixels) and NB output channels of one group; per tap and input
                       channel NB weights (the block's same addresses: one L1 broadcast a warp), then per pixel one
                       load of x (zero outside the input) and NB double FMAs. The sums are exact products rounded once
                       to fp32 at the end, against the packed tile's fp16 hi/lo split: where a group has few channels
                       (K = taps x CIN_G short) the split's own rounding (2^-22 of each operand) is most of the error,
                       and padding CIN_G to 8 channels wastes most products.
                       Flops: 2 M C_out taps CIN_G as double FMAs (half the fp32 rate on an H100/H200), one fp32 to
                       float64 conversion a load of x. Bytes: x read once from memory per column tile (the taps'
                       reuse from L1/L2), each output written once.
"""

from __future__ import annotations

# (NB, PX) by a group's output channels: a thread sums NB channels (the smallest that holds the group's, at most 16)
# at PX pixels (the weights it loads serve PX pixels; 16 x 1 double sums already reuse each x load 16 times)
DIRECT_TILES = ((1, 4), (4, 4), (16, 1))

CONV_DIRECT = r"""
// A thread: pixels m0 + 128 i (i < PX) of the launch, NB output channels of one group. Per tap and input channel:
// NB weights (float64 rows: no conversion), then per pixel one load of x (zero outside the input) and NB double FMAs.
// __launch_bounds__' 4 blocks an SM: at most 128 registers (ptxas' own choice spilled some instantiations)
template <int NB, int PX, class Epi>
__global__ void __launch_bounds__(128, 4) kf_conv_direct_kernel(KfConvArgs a, Epi epi) {
  const long long m0 = (long long)blockIdx.x * (128 * PX) + threadIdx.x;
  const int tiles_g = (a.COUT_G + NB - 1) / NB;
  const int group = (int)blockIdx.y / tiles_g;
  const int c0 = group * a.COUT_G + ((int)blockIdx.y % tiles_g) * NB;
  const int c_end = min(c0 + NB, (group + 1) * a.COUT_G);
  if (m0 >= a.M) return;
  const long long P = (long long)a.OD * a.OH * a.OW, S = (long long)a.D * a.H * a.W;
  const float* xs[PX];  // the pixel's sample and group: its first input channel's plane
  int id0[PX], ih0[PX], iw0[PX], p[PX];
  long long b[PX];
  // m0's sample: a float quotient (B < 2^16 samples: off by at most one) made exact, no 64-bit division (a call,
  // whose spills ptxas counts); the other pixels follow it, 128 apart
  long long bb = (long long)__fdividef((float)m0, (float)P);
  while (bb * P > m0) --bb;
  while ((bb + 1) * P <= m0) ++bb;
  long long pb = m0 - bb * P;
#pragma unroll
  for (int i = 0; i < PX; ++i) {
    if (i > 0 && m0 + 128 * i < a.M) {  // past M: the previous pixel again, never stored
      pb += 128;
      while (pb >= P) pb -= P, ++bb;
    }
    b[i] = bb;
    p[i] = (int)pb;
    const int ow = p[i] % a.OW, oh = p[i] / a.OW % a.OH, od = p[i] / (a.OW * a.OH);
    xs[i] = static_cast<const float*>(a.x) + (b[i] * a.G + group) * a.CIN_G * S;
    id0[i] = od * a.SD - a.PD;
    ih0[i] = oh * a.SH - a.PH;
    iw0[i] = ow * a.SW - a.PW;
  }
  // channel j's row, as an offset from channel c0's (int: kf_conv_operands checks 16 rows fit); past the group's
  // last channel its last channel's again, never stored
  const double* w = static_cast<const double*>(a.w) + (long long)c0 * a.K2;
  int row[NB];
#pragma unroll
  for (int j = 0; j < NB; ++j) row[j] = min(j, c_end - 1 - c0) * (int)a.K2;
  double acc[PX][NB];
#pragma unroll
  for (int i = 0; i < PX; ++i)
#pragma unroll
    for (int j = 0; j < NB; ++j) acc[i][j] = 0.0;
  for (int kd = 0; kd < a.KD; ++kd)
    for (int kh = 0; kh < a.KH; ++kh)
      for (int kw = 0; kw < a.KW; ++kw) {
        int off[PX];  // the tap's input pixel in the plane, or -1 outside the input
#pragma unroll
        for (int i = 0; i < PX; ++i) {
          const int id = id0[i] + kd * a.DD, ih = ih0[i] + kh * a.DH, iw = iw0[i] + kw * a.DW;
          const bool in = (unsigned)id < (unsigned)a.D && (unsigned)ih < (unsigned)a.H && (unsigned)iw < (unsigned)a.W;
          off[i] = in ? (id * a.H + ih) * a.W + iw : -1;
        }
        const double* wt = w + ((kd * a.KH + kh) * a.KW + kw) * a.CP;
#pragma unroll 1  // unrolled, ptxas keeps several channels' loads in flight: 245 registers at NB = 16, spills at 1
        for (int ci = 0; ci < a.CIN_G; ++ci) {
          double wv[NB];
#pragma unroll
          for (int j = 0; j < NB; ++j) wv[j] = __ldg(wt + row[j] + ci);
#pragma unroll
          for (int i = 0; i < PX; ++i) {
            const double v = off[i] < 0 ? 0.0 : (double)__ldg(xs[i] + ci * S + off[i]);
#pragma unroll
            for (int j = 0; j < NB; ++j) acc[i][j] = fma(v, wv[j], acc[i][j]);
          }
        }
      }
  const long long PF = (long long)a.FD * a.FH * a.FW;
#pragma unroll
  for (int i = 0; i < PX; ++i) {
    if (m0 + 128 * i >= a.M) break;
    const long long base = b[i] * a.N * PF + kf_conv_out_pixel(a, p[i]);
#pragma unroll
    for (int j = 0; j < NB; ++j)
      if (c0 + j < c_end) epi(epi.column(c0 + j), base, c0 + j, (float)acc[i][j]);
  }
}

template <int NB, int PX, class Epi>
cudaError_t kf_launch_conv_direct(const KfConvArgs& a, const Epi& epi, cudaStream_t stream) {
  const dim3 grid((unsigned)((a.M + 128 * PX - 1) / (128 * PX)), (unsigned)(a.G * ((a.COUT_G + NB - 1) / NB)));
  kf_conv_direct_kernel<NB, PX, Epi><<<grid, 128, 0, stream>>>(a, epi);
  return cudaGetLastError();
}

// The convolution of `a` with epilogue `epi` on `stream` on the direct tile, NB by the group's output channels
template <class Epi>
int kf_conv_direct(const KfConvArgs& a, const Epi& epi, cudaStream_t stream) {
  if (a.M == 0 || a.N == 0) return 0;
  if (a.COUT_G <= NB_1) return (int)kf_launch_conv_direct<NB_1, PX_1>(a, epi, stream);
  if (a.COUT_G <= NB_2) return (int)kf_launch_conv_direct<NB_2, PX_2>(a, epi, stream);
  return (int)kf_launch_conv_direct<NB_3, PX_3>(a, epi, stream);
}
"""
for _i, (_nb, _px) in enumerate(DIRECT_TILES, 1):
    CONV_DIRECT = CONV_DIRECT.replace(f"NB_{_i}", str(_nb)).replace(f"PX_{_i}", str(_px))
