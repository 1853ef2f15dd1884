"""The fixed CUDA of `--backend cuda`'s pool after a convolution (kfuse/cuda/conv_pools.py): a windowed pool over y,
the convolution's stored output before the pool, NC(D)HW (B C planes of OD x OH x OW).

  kf_window_pool       a thread a pooled value (b, c, qd, qh, qw), kf_window_pool_at: the window's conv pixels
                       (stride, padding, dilation; positions in the padding or past the plane under ceil_mode
                       skipped), max (NaN propagating, -inf where nothing lies inside, as torch's max_pool) or an fp32
                       sum divided as torch's avg_pool divides (divisor_override, else the window clipped to the
                       padded plane, or to the plane without count_include_pad); then the functor on the pooled value
                       at m = b C Q + q, n = c (Q pooled pixels a plane). Index math in 32 bits wherever the sizes
                       allow (64-bit divisions are long software sequences).
A global mean after the convolution or after the pool is rows_source.py's kf_row_stats<0> over the (B C, pixels)
rows, then rows_source.py's kf_rows with the per-(sample, channel) functor, its per-channel operands at m % C.
Bytes: y read once (a window's overlap from L1 / L2), the pooled values written once.
"""

from __future__ import annotations

CONV_POOLS = r"""
// A pool over planes of OD x OH x OW values (kfuse/kernels/pool_geometry.py's PoolGeometry, and torch's avg_pool
// options)
struct KfPoolGeo {
  long long OD, OH, OW, QD, QH, QW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW;
  int divisor;  // divisor_override (0: none)
  bool count_pad;  // count_include_pad
};

// pool: PoolGeometry.args() (M, QD, QH, QW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW)
inline KfPoolGeo kf_pool_geo(long long OD, long long OH, long long OW, const long long* pool, int divisor,
                             bool count_pad) {
  return KfPoolGeo{OD, OH, OW, pool[1], pool[2], pool[3], pool[4], pool[5], pool[6], pool[7], pool[8], pool[9],
                   pool[10], pool[11], pool[12], pool[13], pool[14], pool[15], divisor, count_pad};
}

// Pooled value i (of B C planes of Q = QD QH QW: plane bc = i / Q, channel c = bc % C) of y's planes, then post on it
// at m = (bc - c) Q + q, n = c. Index type I: int where every index of y and of the pooled values fits (kf_window_pool
// decides; the GPU has no integer divider, and a 64-bit division's software sequence is several times a 32-bit
// one's), else long long. Host and device (tests/test_cuda_conv_pools.py runs it on the CPU against torch's pools);
// post may be device-only.
// The type a position is decoded in: unsigned 32-bit (no sign fix-ups), signed 64-bit (the form ptxas builds
// without spilling around its division routine)
template <class I> struct KfDecode;
template <> struct KfDecode<int> { using type = unsigned; };
template <> struct KfDecode<long long> { using type = long long; };

#pragma nv_exec_check_disable
template <bool MAX, class I, class Post>
__host__ __device__ __forceinline__ void kf_window_pool_at(const float* __restrict__ y, I C, I i, const KfPoolGeo& g,
                                                           const Post& post) {
  using U = typename KfDecode<I>::type;
  const I OD = (I)g.OD, OH = (I)g.OH, OW = (I)g.OW;
  const U QH = (U)g.QH, QW = (U)g.QW, Q = (U)g.QD * QH * QW;
  const U q_u = (U)i % Q, bc_u = (U)i / Q;
  const I bc = (I)bc_u, q = (I)q_u, c = (I)(bc_u % (U)C);
  const I qw = (I)(q_u % QW), qh = (I)(q_u / QW % QH), qd = (I)(q_u / QW / QH);
  const float* plane = y + (long long)bc * (OD * OH * OW);
  const I d0 = qd * (I)g.SD - (I)g.PD, h0 = qh * (I)g.SH - (I)g.PH, w0 = qw * (I)g.SW - (I)g.PW;
  float v = MAX ? -INFINITY : 0.0f;
  for (I kd = 0; kd < (I)g.KD; ++kd) {
    const I od = d0 + kd * (I)g.DD;
    if (od < 0 || od >= OD) continue;
    for (I kh = 0; kh < (I)g.KH; ++kh) {
      const I oh = h0 + kh * (I)g.DH;
      if (oh < 0 || oh >= OH) continue;
      const float* row = plane + (od * OH + oh) * OW;
      for (I kw = 0; kw < (I)g.KW; ++kw) {
        const I ow = w0 + kw * (I)g.DW;
        if (ow >= 0 && ow < OW) v = MAX ? kf_nan_max(v, row[ow]) : v + row[ow];
      }
    }
  }
  if (!MAX) {  // torch's avg_pool divisor
    I a0 = d0, b0 = h0, c0 = w0;
    I a1 = d0 + (I)g.KD, b1 = h0 + (I)g.KH, c1 = w0 + (I)g.KW;  // the window clipped to the padded plane
    a1 = a1 < OD + (I)g.PD ? a1 : OD + (I)g.PD;
    b1 = b1 < OH + (I)g.PH ? b1 : OH + (I)g.PH;
    c1 = c1 < OW + (I)g.PW ? c1 : OW + (I)g.PW;
    if (!g.count_pad) {  // ... or to the plane itself
      a0 = a0 > 0 ? a0 : 0, b0 = b0 > 0 ? b0 : 0, c0 = c0 > 0 ? c0 : 0;
      a1 = a1 < OD ? a1 : OD, b1 = b1 < OH ? b1 : OH, c1 = c1 < OW ? c1 : OW;
    }
    v /= g.divisor != 0 ? (float)g.divisor : (float)((a1 - a0) * (b1 - b0) * (c1 - c0));
  }
  post(post.column(c), (long long)(bc - c) * Q + q, c, v);
}

template <bool MAX, class I, class Post>
__global__ void __launch_bounds__(256) kf_window_pool_kernel(const float* __restrict__ y, I C, I total, KfPoolGeo g,
                                                             Post post) {
  const I i = (I)blockIdx.x * 256 + (I)threadIdx.x;
  if (i < total) kf_window_pool_at<MAX, I>(y, C, i, g, post);
}

// The pool of y's B C planes, then post on each pooled value: 32-bit indices where y's elements and the pooled
// values (and a block's overshoot past them) fit in an int
template <bool MAX, class Post>
int kf_window_pool(const float* y, long long BC, long long C, const KfPoolGeo& g, const Post& post,
                   cudaStream_t stream) {
  const long long total = BC * g.QD * g.QH * g.QW;
  if (total == 0) return 0;
  const unsigned blocks = (unsigned)((total + 255) / 256);
  const long long limit = 2147483647LL - 256;
  if (total <= limit && BC * g.OD * g.OH * g.OW <= limit)
    kf_window_pool_kernel<MAX, int, Post><<<blocks, 256, 0, stream>>>(y, (int)C, (int)total, g, post);
  else
    kf_window_pool_kernel<MAX, long long, Post><<<blocks, 256, 0, stream>>>(y, C, total, g, post);
  return (int)cudaGetLastError();
}
"""
