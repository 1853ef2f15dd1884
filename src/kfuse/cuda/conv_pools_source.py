"""The fixed CUDA of `--backend cuda`'s pool after a convolution (kfuse/cuda/conv_pools.py): a windowed pool over y,
the convolution's stored output before the pool, NC(D)HW (B C planes of OD x OH x OW).

  kf_window_pool       a thread a pooled value (b, c, qd, qh, qw): the window's conv pixels (stride, padding,
                       dilation; positions in the padding or past the plane under ceil_mode skipped), max (NaN
                       propagating, -inf where nothing lies inside, as torch's max_pool) or an fp32 sum divided as
                       torch's avg_pool divides (divisor_override, else the window clipped to the padded plane, or to
                       the plane without count_include_pad); then the functor on the pooled value at m = b C Q + q,
                       n = c (Q pooled pixels a plane).
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

template <bool MAX, class Post>
__global__ void __launch_bounds__(256) kf_window_pool_kernel(const float* __restrict__ y, long long C, long long total,
                                                             KfPoolGeo g, Post post) {
  const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
  if (i >= total) return;
  const long long Q = g.QD * g.QH * g.QW, q = i % Q, bc = i / Q, c = bc % C;
  const long long qw = q % g.QW, qh = (q / g.QW) % g.QH, qd = q / (g.QW * g.QH);
  const float* plane = y + bc * (g.OD * g.OH * g.OW);
  const long long d0 = qd * g.SD - g.PD, h0 = qh * g.SH - g.PH, w0 = qw * g.SW - g.PW;
  float v = MAX ? -INFINITY : 0.0f;
  for (long long kd = 0; kd < g.KD; ++kd) {
    const long long od = d0 + kd * g.DD;
    if (od < 0 || od >= g.OD) continue;
    for (long long kh = 0; kh < g.KH; ++kh) {
      const long long oh = h0 + kh * g.DH;
      if (oh < 0 || oh >= g.OH) continue;
      const float* row = plane + (od * g.OH + oh) * g.OW;
      for (long long kw = 0; kw < g.KW; ++kw) {
        const long long ow = w0 + kw * g.DW;
        if (ow >= 0 && ow < g.OW) v = MAX ? kf_nan_max(v, row[ow]) : v + row[ow];
      }
    }
  }
  if (!MAX) {  // torch's avg_pool divisor
    long long a0 = d0, b0 = h0, c0 = w0;
    long long a1 = min(d0 + g.KD, g.OD + g.PD), b1 = min(h0 + g.KH, g.OH + g.PH), c1 = min(w0 + g.KW, g.OW + g.PW);
    if (!g.count_pad) {
      a0 = max(a0, 0LL), b0 = max(b0, 0LL), c0 = max(c0, 0LL);
      a1 = min(a1, g.OD), b1 = min(b1, g.OH), c1 = min(c1, g.OW);
    }
    v /= g.divisor != 0 ? (float)g.divisor : (float)((a1 - a0) * (b1 - b0) * (c1 - c0));
  }
  post(post.column(c), bc / C * C * Q + q, c, v);
}

// The pool of y's B C planes, then post on each pooled value
template <bool MAX, class Post>
int kf_window_pool(const float* y, long long BC, long long C, const KfPoolGeo& g, const Post& post,
                   cudaStream_t stream) {
  const long long total = BC * g.QD * g.QH * g.QW;
  if (total == 0) return 0;
  kf_window_pool_kernel<MAX, Post><<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(y, C, total, g, post);
  return (int)cudaGetLastError();
}
"""
