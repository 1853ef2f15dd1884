"""The fixed CUDA C++ of the norm region kinds: GroupNorm over a GEMM's columns, BatchNorm1d over its rows.

A norm region (GEMM -> pointwise ops -> norm -> pointwise ops) runs as the GEMM with its pre-norm ops as the
epilogue functor, which stores u (the norm's input, fp32 M x N) and any pre-norm value read later, then one of
these passes over u, each calling the region's post-norm functor (the same functor shape as the GEMM's epilogue:
`post(post.column(n), m, n, value)`, value = the norm's output) on every element:
  kf_group_norm_vec_kernel  one team of T lanes (T a power of two, at most 32) per (row, group) of G columns, each
                         lane holding its share of the group in registers as float4s (G % 4 == 0, G <= 1024): the
                         group's mean (fp32 sums, a butterfly within the team), then the biased variance of u - mean
                         (a second pass over the registers: no E[x^2] - E[x]^2 cancellation), then
                         (u - mean) / sqrt(var + eps), the affine, the post functor: torch's group_norm. Bytes: u read
                         once, the outputs written once. kf_group_norm_kernel: the same for any G, one float per
                         lane and step, each value read three times (from L1 after the first).
  kf_col_stats_kernel    BatchNorm's batch statistics: per (chunk of rows, 32 columns) the sums of u - shift and
                         (u - shift)^2 in double, shift = the column's first value (so the sums stay near the
                         spread, not the mean); kf_bn_finalize_kernel adds the chunks per column, writes mean and
                         1 / sqrt(var + eps) (biased variance, torch's training normalization) and updates the
                         running statistics (unbiased variance, torch's momentum rule) where asked.
                         kf_bn_running_kernel: eval mode's mean and 1 / sqrt(running_var + eps) instead.
  kf_bn_apply_kernel     (u - mean) * rstd * gamma + beta per column, then the post functor.
Bytes of BatchNorm beyond the GEMM: u read twice (statistics, apply), the outputs written once.
"""

from __future__ import annotations

COL_STATS_ROWS = 8  # rows of a column-statistics block (32 columns x 8 rows of threads)

# The chunks of rows a pass over (M, N) values splits M into (the BatchNorm passes here, the row kinds' apply and
# pool passes in rows_source.py): in a translation unit that has either.
ROW_CHUNKS = r"""
// The chunks of rows the statistics and apply passes split M into: about 8 blocks per SM in all.
inline long long kf_row_chunks(long long M, long long column_blocks) {
  int device = 0, sms = 132;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const long long want = (8LL * sms + column_blocks - 1) / column_blocks;
  return max(1LL, min(M, min(want, 65535LL)));
}
"""

GROUP_NORM = r"""
// The sum of v over each aligned team of T lanes (T a power of two dividing 32); every lane of the warp calls it.
__device__ __forceinline__ float kf_team_sum(float v, int T) {
  for (int o = T / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class Post>
__global__ void kf_group_norm_kernel(const float* __restrict__ u, long long M, long long N, int G, int T,
                                     const float* __restrict__ gamma, const float* __restrict__ beta, float eps,
                                     Post post) {
  const long long teams = M * (N / G);
  const long long team = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / T;
  const int t = threadIdx.x % T;
  const bool live = team < teams;  // dead lanes still take part in the butterflies
  const long long m = live ? team / (N / G) : 0, c0 = live ? team % (N / G) * G : 0;
  const float* row = u + m * N + c0;
  float s = 0.0f;
  if (live)
    for (int j = t; j < G; j += T) s += row[j];
  const float mean = kf_team_sum(s, T) / G;
  float q = 0.0f;
  if (live)
    for (int j = t; j < G; j += T) {
      const float d = row[j] - mean;
      q += d * d;
    }
  const float rstd = 1.0f / sqrtf(kf_team_sum(q, T) / G + eps);
  if (!live) return;
  for (int j = t; j < G; j += T) {
    const long long n = c0 + j;
    float v = (row[j] - mean) * rstd;
    if (gamma != nullptr) v = v * gamma[n] + beta[n];
    post(post.column(n), m, n, v);
  }
}

// The same with 16-byte loads, the group held in registers: G % 4 == 0 and N % 4 == 0 (every group starts 16-byte
// aligned), each lane of a team holding PER float4s of its group (lane t: float4s t, t + T, ...), read once.
template <int PER, class Post>
__global__ void kf_group_norm_vec_kernel(const float* __restrict__ u, long long M, long long N, int G, int T,
                                         const float* __restrict__ gamma, const float* __restrict__ beta, float eps,
                                         Post post) {
  const long long groups = N / G;
  const long long team = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / T;
  const int t = threadIdx.x % T, V = G / 4;
  const bool live = team < M * groups;
  const long long m = live ? team / groups : 0, c0 = live ? team % groups * G : 0;
  const float4* row = reinterpret_cast<const float4*>(u + m * N + c0);
  float4 x[PER];
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = t + i * T;
    x[i] = live && j < V ? row[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    s += (x[i].x + x[i].y) + (x[i].z + x[i].w);
  }
  const float mean = kf_team_sum(s, T) / G;
  float q = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    if (t + i * T < V) {
      const float a = x[i].x - mean, b = x[i].y - mean, c = x[i].z - mean, d = x[i].w - mean;
      q += (a * a + b * b) + (c * c + d * d);
    }
  }
  const float rstd = 1.0f / sqrtf(kf_team_sum(q, T) / G + eps);
  if (!live) return;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = t + i * T;
    if (j >= V) continue;
    const float vals[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const long long n = c0 + 4 * j + e;
      float v = (vals[e] - mean) * rstd;
      if (gamma != nullptr) v = v * gamma[n] + beta[n];
      post(post.column(n), m, n, v);
    }
  }
}

template <int PER, class Post>
int kf_launch_group_norm_vec(const float* u, long long M, long long N, int G, int T, const float* gamma,
                             const float* beta, float eps, const Post& post, cudaStream_t stream) {
  const long long threads = M * (N / G) * T, block = 256;
  kf_group_norm_vec_kernel<PER, Post><<<static_cast<unsigned>((threads + block - 1) / block), block, 0, stream>>>(
      u, M, N, G, T, gamma, beta, eps, post);
  return static_cast<int>(cudaGetLastError());
}

// GroupNorm of u's rows in groups of G columns, then post: the register kernel where the groups are whole float4s
// and at most 32 lanes x 8 float4s (1024 columns), else the scalar one (reading each value three times).
template <class Post>
int kf_group_norm(const float* u, long long M, long long N, int G, const float* gamma, const float* beta, float eps,
                  const Post& post, cudaStream_t stream) {
  if (M == 0 || N == 0) return 0;
  if (G % 4 == 0 && N % 4 == 0 && G <= 1024) {
    int T = 1;
    while (T * 2 <= G / 4 && T * 2 <= 32) T *= 2;
    const int per = (G / 4 + T - 1) / T;
    if (per == 1) return kf_launch_group_norm_vec<1>(u, M, N, G, T, gamma, beta, eps, post, stream);
    if (per == 2) return kf_launch_group_norm_vec<2>(u, M, N, G, T, gamma, beta, eps, post, stream);
    if (per <= 4) return kf_launch_group_norm_vec<4>(u, M, N, G, T, gamma, beta, eps, post, stream);
    return kf_launch_group_norm_vec<8>(u, M, N, G, T, gamma, beta, eps, post, stream);
  }
  int T = 1;
  while (T * 2 <= G && T * 2 <= 32) T *= 2;
  const long long threads = M * (N / G) * T, block = 256;
  kf_group_norm_kernel<Post><<<static_cast<unsigned>((threads + block - 1) / block), block, 0, stream>>>(
      u, M, N, G, T, gamma, beta, eps, post);
  return static_cast<int>(cudaGetLastError());
}
"""

BATCH_NORM = r"""
// part (2, chunks, N): per chunk of rows, sum(u - shift) and sum((u - shift)^2) per column, shift = u[0, n]
__global__ void kf_col_stats_kernel(const float* __restrict__ u, long long M, long long N, long long rows,
                                    double* __restrict__ part) {
  __shared__ double s1[KF_STATS_ROWS][33], s2[KF_STATS_ROWS][33];
  const long long n = static_cast<long long>(blockIdx.x) * 32 + threadIdx.x;
  const long long r0 = static_cast<long long>(blockIdx.y) * rows, r1 = min(M, r0 + rows);
  double a = 0.0, b = 0.0;
  if (n < N) {
    const double shift = u[n];
    long long m = r0 + threadIdx.y;
#pragma unroll 4
    for (; m < r1; m += KF_STATS_ROWS) {
      const double d = static_cast<double>(u[m * N + n]) - shift;
      a += d;
      b += d * d;
    }
  }
  s1[threadIdx.y][threadIdx.x] = a;
  s2[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && n < N) {
    for (int r = 1; r < KF_STATS_ROWS; ++r) {
      a += s1[r][threadIdx.x];
      b += s2[r][threadIdx.x];
    }
    part[static_cast<long long>(blockIdx.y) * N + n] = a;
    part[(static_cast<long long>(gridDim.y) + blockIdx.y) * N + n] = b;
  }
}

// mean and rstd per column from the chunks' sums (shifted by the column's first value, u[n shift_stride]); factor
// >= 0: also running = (1 - factor) running + factor batch (the unbiased variance), as torch's training-mode
// batch_norm does
__global__ void kf_bn_finalize_kernel(const float* __restrict__ u, const double* __restrict__ part, long long M,
                                      long long N, int chunks, long long shift_stride, float eps, float factor,
                                      float* __restrict__ mean, float* __restrict__ rstd, float* running_mean,
                                      float* running_var) {
  const long long n = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  double a = 0.0, b = 0.0;
  for (int c = 0; c < chunks; ++c) {
    a += part[static_cast<long long>(c) * N + n];
    b += part[static_cast<long long>(chunks + c) * N + n];
  }
  const double d = a / M;
  const double var = fmax(b / M - d * d, 0.0);
  const double mu = static_cast<double>(u[n * shift_stride]) + d;
  mean[n] = static_cast<float>(mu);
  rstd[n] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  if (factor >= 0.0f) {
    running_mean[n] = static_cast<float>((1.0 - factor) * running_mean[n] + factor * mu);
    running_var[n] = static_cast<float>((1.0 - factor) * running_var[n] + factor * var * M / (M - 1));
  }
}

__global__ void kf_bn_running_kernel(const float* __restrict__ running_mean, const float* __restrict__ running_var,
                                     long long N, float eps, float* __restrict__ mean, float* __restrict__ rstd) {
  const long long n = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  mean[n] = running_mean[n];
  rstd[n] = static_cast<float>(1.0 / sqrt(static_cast<double>(running_var[n]) + static_cast<double>(eps)));
}

// one thread per column, a chunk of rows per block: the column's statistics, affine and post.column(n) read once
template <class Post>
__global__ void kf_bn_apply_kernel(const float* __restrict__ u, long long M, long long N, long long rows,
                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                   const float* __restrict__ gamma, const float* __restrict__ beta, Post post) {
  const long long n = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float mu = mean[n], rs = rstd[n];
  const float w = gamma != nullptr ? gamma[n] : 1.0f, b = gamma != nullptr ? beta[n] : 0.0f;
  const auto c = post.column(n);
  const long long r0 = static_cast<long long>(blockIdx.y) * rows, r1 = min(M, r0 + rows);
#pragma unroll 4
  for (long long m = r0; m < r1; ++m) {
    float v = (u[m * N + n] - mu) * rs;
    if (gamma != nullptr) v = v * w + b;
    post(c, m, n, v);
  }
}

// BatchNorm over the rows of u (M, N) then the post functor. batch: the batch statistics (part: 2 * chunks * N
// doubles from kf_bn_chunks), updating the running statistics where factor >= 0; else the running statistics.
template <class Post>
int kf_batch_norm(const float* u, long long M, long long N, bool batch, double* part, long long chunks, float eps,
                  float factor, float* running_mean, float* running_var, float* mean, float* rstd,
                  const float* gamma, const float* beta, const Post& post, cudaStream_t stream) {
  if (M == 0 || N == 0) return 0;
  const unsigned col_blocks = static_cast<unsigned>((N + 31) / 32), vec_blocks = static_cast<unsigned>((N + 255) / 256);
  if (batch) {
    const long long rows = (M + chunks - 1) / chunks;
    kf_col_stats_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), dim3(32, KF_STATS_ROWS), 0, stream>>>(
        u, M, N, rows, part);
    kf_bn_finalize_kernel<<<vec_blocks, 256, 0, stream>>>(u, part, M, N, static_cast<int>(chunks), 1, eps, factor,
                                                          mean, rstd, running_mean, running_var);
  } else {
    kf_bn_running_kernel<<<vec_blocks, 256, 0, stream>>>(running_mean, running_var, N, eps, mean, rstd);
  }
  const long long apply_chunks = kf_row_chunks(M, vec_blocks), rows = (M + apply_chunks - 1) / apply_chunks;
  kf_bn_apply_kernel<Post><<<dim3(vec_blocks, static_cast<unsigned>(apply_chunks)), 256, 0, stream>>>(
      u, M, N, rows, mean, rstd, gamma, beta, post);
  return static_cast<int>(cudaGetLastError());
}

// The chunks of rows kf_batch_norm's statistics use (its part holds 2 * chunks * N doubles).
long long kf_bn_chunks(long long M, long long N) { return kf_row_chunks(M, (N + 31) / 32); }
""".replace("KF_STATS_ROWS", str(COL_STATS_ROWS))

# declared for the C++ translation unit, which sizes the statistics' scratch
BATCH_NORM_DECLS = r"""
long long kf_bn_chunks(long long M, long long N);
"""
