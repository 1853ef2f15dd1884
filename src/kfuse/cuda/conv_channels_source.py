"""The fixed CUDA of `--backend cuda`'s reduction over a convolution's channels (kfuse/cuda/conv_channels.py): one pass
over y, the convolution's stored output before the reduction, NC(D)HW (B, C, P).

  kf_channel_reduce    a thread a pixel (b, p): the statistic over its C channels, strided by P (neighbouring threads
                       read neighbouring pixels, so every load is coalesced): STAT 0 the sum in float64 (divided by
                       `divisor`: a mean), 1 the max, 2 the min (NaN propagating, as torch's amax / amin), 3
                       logsumexp (the max, then a float64 sum of exp(y - max)); stored at the pixel b P + p of st_a;
                       then the per-pixel functor on it (Row: the ops after the reduction, storing the per-pixel
                       outputs at that index), then the full-width functor on each of the pixel's C elements of y
                       (Post: softmax = exp(y - logsumexp) and the ops reading a per-pixel value; m the pixel, n the
                       channel). KfNoOps stands for a functor the region has none of.
Bytes: y read once by the sum, max or min, twice by logsumexp, once more where Post runs (from L2 where the (C, P)
plane of the blocks in flight fits), each output written once.
"""

from __future__ import annotations

CONV_CHANNELS = r"""
// A functor that does nothing: a channel pass without per-pixel or without full-width ops.
struct KfNoOps {
  struct Col {};
  __device__ __forceinline__ Col column(long long) const { return {}; }
  __device__ __forceinline__ void operator()(const Col&, long long, long long, float) const {}
};

template <int STAT, class Row, class Post>
__global__ void __launch_bounds__(128) kf_channel_reduce_kernel(const float* __restrict__ y, long long C, long long P,
                                                                double divisor, float* __restrict__ st_a, Row row,
                                                                Post post) {
  const long long p = (long long)blockIdx.x * 128 + threadIdx.x;
  if (p >= P) return;
  const long long b = blockIdx.y, px = b * P + p;
  const float* yp = y + b * C * P + p;
  float r;
  if (STAT == 0) {
    double s = 0.0;
#pragma unroll 4
    for (long long c = 0; c < C; ++c) s += yp[c * P];
    r = (float)(s / divisor);
  } else {
    float v = STAT == 2 ? INFINITY : -INFINITY;
#pragma unroll 4
    for (long long c = 0; c < C; ++c) v = STAT == 2 ? kf_nan_min(v, yp[c * P]) : kf_nan_max(v, yp[c * P]);
    r = v;
    if (STAT == 3 && isfinite(v)) {  // an infinite or NaN max is logsumexp itself
      double s = 0.0;
#pragma unroll 4
      for (long long c = 0; c < C; ++c) s += expf(yp[c * P] - v);
      r = v + (float)log(s);
    }
  }
  st_a[px] = r;
  row(row.column(0), px, 0, r);
#pragma unroll 4
  for (long long c = 0; c < C; ++c) post(post.column(c), px, c, yp[c * P]);
}

template <int STAT, class Row, class Post>
int kf_channel_reduce(const float* y, long long B, long long C, long long P, double divisor, float* st_a,
                      const Row& row, const Post& post, cudaStream_t stream) {
  if (B == 0 || P == 0) return 0;
  const dim3 grid((unsigned)((P + 127) / 128), (unsigned)B);
  kf_channel_reduce_kernel<STAT, Row, Post><<<grid, 128, 0, stream>>>(y, C, P, divisor, st_a, row, post);
  return (int)cudaGetLastError();
}
"""
