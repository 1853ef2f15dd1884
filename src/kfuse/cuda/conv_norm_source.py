"""The fixed CUDA of `--backend cuda`'s norm-after-convolution kinds (kfuse/cuda/conv_norms.py): the norm's pass over
u, the convolution's stored output before the norm, NC(D)HW (B, C, P).

  kf_chunk_stats_kernel  the statistics of both norms: a block per (column c, chunk of its B P values in sample-major
                       order, the values at (b C + c) P + p): float64 sums of u - shift and (u - shift)^2, shift = the
                       column's first value (the sums stay near the spread, not the mean), four loads in flight a
                       thread; norm_source.py's kf_bn_finalize_kernel merges a column's chunks into mean and 1 /
                       sqrt(biased variance + eps). About 8 blocks per SM in all (kf_conv_stat_chunks), so a few long
                       columns (a GroupNorm of few (sample, group) pairs) still fill the GPU.
  kf_conv_norm         GroupNorm / InstanceNorm: a (sample, group)'s values are one contiguous run of C/G x P, so its
                       columns are u seen as (1, B G, C/G P); then kf_conv_norm_apply_kernel, blocks of 256 pixels of
                       one channel plane: (u - mean) rstd, the affine of the channel (an fma), and the post functor at
                       m = b C P + p, n = c (the conv kind's element convention).
  kf_conv_batch_norm   BatchNorm: with batch statistics the columns are the channels (the finalize also updates the
                       running statistics as torch does); with running statistics, kf_bn_running_kernel; then the
                       apply with one statistic a channel.
Bytes: u read twice (statistics, apply), each output written once.
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

// part (2, chunks, C): per (column c, chunk of its B P values in sample-major order) sum(u - shift) and
// sum((u - shift)^2) in float64, shift = u[c P] (sample 0, pixel 0). A value past the chunk counts as the shift
// (adds nothing), so each thread loads four before it adds.
__global__ void __launch_bounds__(256) kf_chunk_stats_kernel(const float* __restrict__ u, long long C, long long P,
                                                             long long per_chunk, long long total,
                                                             double* __restrict__ part) {
  __shared__ double scratch[32];
  const long long c = blockIdx.x, e0 = (long long)blockIdx.y * per_chunk, e1 = min(total, e0 + per_chunk);
  const float shift = u[c * P];
  double a = 0.0, q = 0.0;
  long long e = e0 + threadIdx.x, b = e / P, p = e - b * P;
  for (; e < e1; e += 4 * 256) {
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = e + k * 256 < e1 ? u[(b * C + c) * P + p] : shift;
      for (p += 256; p >= P; p -= P) ++b;  // the thread's next value: 256 further in sample-major order
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const double d = (double)v[k] - (double)shift;
      a += d;
      q += d * d;
    }
  }
  a = kf_block_reduce<0>(a, scratch);
  q = kf_block_reduce<0>(q, scratch);
  if (threadIdx.x == 0) {
    part[(long long)blockIdx.y * C + c] = a;
    part[((long long)gridDim.y + blockIdx.y) * C + c] = q;
  }
}

// The chunks kf_chunk_stats_kernel splits each of C columns of B P values into (part: 2 chunks C doubles): about 8
// blocks per SM in all, at least 1024 values a chunk.
long long kf_conv_stat_chunks(long long B, long long C, long long P) {
  return kf_row_chunks((B * P + 1023) / 1024, C);
}

// mean and rstd of the C columns of B P values each (scratch: part, 2 chunks C doubles); factor >= 0: also the
// running statistics' update (kf_bn_finalize_kernel)
inline void kf_chunk_stats(const float* u, long long B, long long C, long long P, double* part, long long chunks,
                           float eps, float factor, float* mean, float* rstd, float* running_mean, float* running_var,
                           cudaStream_t stream) {
  const long long total = B * P, per_chunk = (total + chunks - 1) / chunks;
  kf_chunk_stats_kernel<<<dim3((unsigned)C, (unsigned)chunks), 256, 0, stream>>>(u, C, P, per_chunk, total, part);
  kf_bn_finalize_kernel<<<(unsigned)((C + 255) / 256), 256, 0, stream>>>(u, part, total, C, (int)chunks, P, eps,
                                                                         factor, mean, rstd, running_mean,
                                                                         running_var);
}

// The norm of u (B, C, P) in groups of `group` channels, then post on each element; mean and rstd: B C / group
// floats each, part: 2 chunks B C / group doubles (kf_conv_stat_chunks(1, B C / group, group P))
template <class Post>
int kf_conv_norm(const float* u, long long B, long long C, long long P, int group, float eps, const float* gamma,
                 const float* beta, float* mean, float* rstd, double* part, long long chunks, const Post& post,
                 cudaStream_t stream) {
  if (B == 0 || C == 0 || P == 0) return 0;
  kf_chunk_stats(u, 1, B * (C / group), group * P, part, chunks, eps, -1.0f, mean, rstd, nullptr, nullptr, stream);
  const dim3 grid((unsigned)((P + 255) / 256), (unsigned)C, (unsigned)B);
  kf_conv_norm_apply_kernel<Post><<<grid, 256, 0, stream>>>(u, C, P, group, C / group, mean, rstd, gamma, beta, post);
  return (int)cudaGetLastError();
}
"""

CONV_BATCH_NORM = r"""
// BatchNorm of u (B, C, P) over each channel's B P values, then post on each element. batch: the batch statistics
// (part: 2 chunks C doubles, kf_conv_stat_chunks(B, C, P); updating the running statistics where factor >= 0); else
// the running statistics. mean, rstd: C floats each.
template <class Post>
int kf_conv_batch_norm(const float* u, long long B, long long C, long long P, bool batch, double* part,
                       long long chunks, float eps, float factor, float* running_mean, float* running_var, float* mean,
                       float* rstd, const float* gamma, const float* beta, const Post& post, cudaStream_t stream) {
  if (B == 0 || C == 0 || P == 0) return 0;
  if (batch)
    kf_chunk_stats(u, B, C, P, part, chunks, eps, factor, mean, rstd, running_mean, running_var, stream);
  else
    kf_bn_running_kernel<<<(unsigned)((C + 255) / 256), 256, 0, stream>>>(running_mean, running_var, C, eps, mean,
                                                                          rstd);
  const dim3 grid((unsigned)((P + 255) / 256), (unsigned)C, (unsigned)B);
  kf_conv_norm_apply_kernel<Post><<<grid, 256, 0, stream>>>(u, C, P, 1, 0, mean, rstd, gamma, beta, post);
  return (int)cudaGetLastError();
}
"""

CONV_NORM_DECLS = r"""
long long kf_conv_stat_chunks(long long B, long long C, long long P);
"""
