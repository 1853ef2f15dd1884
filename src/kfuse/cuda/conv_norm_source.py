"""The fixed CUDA of `--backend cuda`'s norm-after-convolution kinds (kfuse/cuda/conv_norms.py, conv_bn.py): the norm's
pass over u, the convolution's stored output before the norm, NC(D)HW (B, C, P).

  kf_conv_norm         a (sample, group)'s values are one contiguous run of C/G x P in NC(D)HW, so its statistics are
                       rows_source.py's kf_row_stats<4> over u seen as (B G, C/G P) rows (a block a run: float64
                       sums, the mean, then the centred squares: 1 / sqrt(biased variance + eps)); then
                       kf_conv_norm_apply_kernel, blocks of 256 pixels of one channel plane: (u - mean) rstd, the
                       affine of the channel (an fma), and the post functor at m = b C P + p, n = c (the conv
                       kind's element convention). Bytes: u read three times (twice by the statistics, from L2 where
                       a run fits), each output written once.
  kf_conv_batch_norm   BatchNorm: with batch statistics, kf_conv_col_stats_kernel (a block per (channel, chunk of its
                       B P values, sample-major): float64 sums of u - shift and (u - shift)^2, shift = the channel's
                       first value), norm_source.py's kf_bn_finalize_kernel (the chunks merged per channel, the
                       running statistics updated as torch does); with running statistics, kf_bn_running_kernel;
                       then kf_conv_norm_apply_kernel with one statistic a channel. Bytes: u read twice, each output
                       written once.
"""

from __future__ import annotations

CONV_NORM = r"""
// stats index of (sample b, channel c): b per_sample + c / group (GroupNorm: per_sample = C / group; BatchNorm: 0, 1)
template <class Post>
__global__ void __launch_bounds__(256) kf_conv_norm_apply_kernel(const float* __restrict__ u, long long C, long long P,
                                                                 int group, long long per_sample,
                                                                 const float* __restrict__ mean,
                                                                 const float* __restrict__ rstd,
                                                                 const float* __restrict__ gamma,
                                                                 const float* __restrict__ beta, Post post) {
  const long long p = (long long)blockIdx.x * 256 + threadIdx.x;
  if (p >= P) return;
  const int c = (int)blockIdx.y;
  const long long b = blockIdx.z;
  const long long s = b * per_sample + c / group;  // the statistics' row
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
  kf_conv_norm_apply_kernel<Post><<<grid, 256, 0, stream>>>(u, C, P, group, C / group, mean, rstd, gamma, beta, post);
  return (int)cudaGetLastError();
}
"""

CONV_BATCH_NORM = r"""
// part (2, chunks, C): per (channel c, chunk of its B P values in sample-major order) sum(u - shift) and
// sum((u - shift)^2) in float64, shift = u[c P] (sample 0, pixel 0)
__global__ void __launch_bounds__(256) kf_conv_col_stats_kernel(const float* __restrict__ u, long long C, long long P,
                                                                long long per_chunk, long long total,
                                                                double* __restrict__ part) {
  __shared__ double scratch[32];
  const long long c = blockIdx.x, e0 = (long long)blockIdx.y * per_chunk, e1 = min(total, e0 + per_chunk);
  const double shift = u[c * P];
  double a = 0.0, q = 0.0;
  long long e = e0 + threadIdx.x, b = e / P, p = e - b * P;
  for (; e < e1; e += 256) {
    const double d = (double)u[(b * C + c) * P + p] - shift;
    a += d;
    q += d * d;
    for (p += 256; p >= P; p -= P) ++b;  // the next value of this thread: 256 further in sample-major order
  }
  a = kf_block_reduce<0>(a, scratch);
  q = kf_block_reduce<0>(q, scratch);
  if (threadIdx.x == 0) {
    part[(long long)blockIdx.y * C + c] = a;
    part[((long long)gridDim.y + blockIdx.y) * C + c] = q;
  }
}

// The chunks kf_conv_batch_norm's statistics split each channel's B P values into (its part: 2 chunks C doubles):
// about 8 blocks per SM in all, at least 1024 values a chunk.
long long kf_conv_bn_chunks(long long B, long long C, long long P) { return kf_row_chunks((B * P + 1023) / 1024, C); }

// BatchNorm of u (B, C, P) over each channel's B P values, then post on each element. batch: the batch statistics
// (updating the running statistics where factor >= 0); else the running statistics. mean, rstd: C floats each.
template <class Post>
int kf_conv_batch_norm(const float* u, long long B, long long C, long long P, bool batch, double* part,
                       long long chunks, float eps, float factor, float* running_mean, float* running_var, float* mean,
                       float* rstd, const float* gamma, const float* beta, const Post& post, cudaStream_t stream) {
  if (B == 0 || C == 0 || P == 0) return 0;
  const unsigned vec_blocks = (unsigned)((C + 255) / 256);
  if (batch) {
    const long long total = B * P, per_chunk = (total + chunks - 1) / chunks;
    kf_conv_col_stats_kernel<<<dim3((unsigned)C, (unsigned)chunks), 256, 0, stream>>>(u, C, P, per_chunk, total, part);
    kf_bn_finalize_kernel<<<vec_blocks, 256, 0, stream>>>(u, part, total, C, (int)chunks, P, eps, factor, mean, rstd,
                                                          running_mean, running_var);
  } else {
    kf_bn_running_kernel<<<vec_blocks, 256, 0, stream>>>(running_mean, running_var, C, eps, mean, rstd);
  }
  const dim3 grid((unsigned)((P + 255) / 256), (unsigned)C, (unsigned)B);
  kf_conv_norm_apply_kernel<Post><<<grid, 256, 0, stream>>>(u, C, P, 1, 0, mean, rstd, gamma, beta, post);
  return (int)cudaGetLastError();
}
"""

CONV_BATCH_NORM_DECLS = r"""
long long kf_conv_bn_chunks(long long B, long long C, long long P);
"""
