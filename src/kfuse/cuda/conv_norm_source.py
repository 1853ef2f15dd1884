"""The fixed CUDA of `--backend cuda`'s norm-after-convolution kind (kfuse/cuda/conv_norms.py): the norm's pass over
u, the convolution's stored output before the norm, NC(D)HW (B, C, P).

  kf_conv_norm         a (sample, group)'s values are one contiguous run of C/G x P in NC(D)HW, so its statistics are
                       rows_source.py's kf_row_stats<4> over u seen as (B G, C/G P) rows (a block a run: float64
                       sums, the mean, then the centred squares: 1 / sqrt(biased variance + eps)); then
                       kf_conv_norm_apply_kernel, blocks of 256 pixels of one channel plane: (u - mean) rstd, the
                       affine of the channel (an fma), and the post functor at m = b C P + p, n = c (the conv
                       kind's element convention). Bytes: u read three times (twice by the statistics, from L2 where
                       a run fits), each output written once.
"""

from __future__ import annotations

CONV_NORM = r"""
template <class Post>
__global__ void __launch_bounds__(256) kf_conv_norm_apply_kernel(const float* __restrict__ u, long long C, long long P,
                                                                 int group, const float* __restrict__ mean,
                                                                 const float* __restrict__ rstd,
                                                                 const float* __restrict__ gamma,
                                                                 const float* __restrict__ beta, Post post) {
  const long long p = (long long)blockIdx.x * 256 + threadIdx.x;
  if (p >= P) return;
  const int c = (int)blockIdx.y;
  const long long b = blockIdx.z;
  const long long s = b * (C / group) + c / group;  // the (sample, group) row of the statistics
  float v = (u[(b * C + c) * P + p] - mean[s]) * rstd[s];
  if (gamma != nullptr) v = beta != nullptr ? fmaf(v, gamma[c], beta[c]) : v * gamma[c];
  else if (beta != nullptr) v += beta[c];
  post(post.column(c), b * C * P + p, c, v);
}

// The norm of u (B, C, P) in groups of `group` channels, then post on each element; mean and rstd: B C / group
// floats each (scratch)
template <class Post>
int kf_conv_norm(const float* u, long long B, long long C, long long P, int group, float eps, const float* gamma,
                 const float* beta, float* mean, float* rstd, const Post& post, cudaStream_t stream) {
  if (B == 0 || C == 0 || P == 0) return 0;
  const int err = kf_row_stats<4>(u, B * (C / group), group * P, 1.0, eps, mean, rstd, stream);
  if (err != 0) return err;
  const dim3 grid((unsigned)((P + 255) / 256), (unsigned)C, (unsigned)B);
  kf_conv_norm_apply_kernel<Post><<<grid, 256, 0, stream>>>(u, C, P, group, mean, rstd, gamma, beta, post);
  return (int)cudaGetLastError();
}
"""
