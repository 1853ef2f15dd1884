"""The fixed CUDA C++ of the row kinds: the row sum rewritten to a GEMV (kfuse/cuda/rowsum.py) and a reduction or
row norm over a GEMM's features (kfuse/cuda/rowreduce.py).

  kf_row_dot_kernel     a float64 dot product of each row of x with a vector (a warp per row), then the region's
                        per-row functor
  kf_row_stats_kernel   one block per row of y (M, N): the statistic a reduction or row norm needs, in two passes
                        where it has two parts: STAT 0 the sum in float64 (divided by `divisor`: a mean), 1 the max,
                        2 the min (NaN propagating, as torch's amax / amin), 3 logsumexp (the max, then the sum of
                        exp(y - max)), 4 the mean and 1 / sqrt(biased variance + eps) (float64 sums, the variance
                        of y - mean: no E[y^2] - E[y]^2 cancellation); st_a (M,) and st_b (M,)
  kf_rows_kernel        a thread per row: the per-row functor on st_a, its per-column operands at m % columns (1 for a
                        GEMM's rows; C for a convolution's (sample, channel) means: the row's channel)
  kf_rows_apply_kernel  a thread per column and a chunk of rows per block: the full-width functor on y's elements
  kf_pool_kernel        a pool over a row's features (kfuse/cuda/pool.py): each window of k consecutive features
                        (stride k, the last N % k dropped, as torch's floor mode) reduced to its max (NaN
                        propagating, as torch's max_pool1d) or mean (an fp32 sum over the window / k, as
                        avg_pool1d), then the functor on the pooled value
"""

from __future__ import annotations

ROW_DOT = r"""
// out[m] = (x[m, :] . w + bsum[0]) / divisor in float64, rounded once, then post(.., m, 0, out): a warp per row
template <class Post>
__global__ void kf_row_dot_kernel(const float* __restrict__ x, long long M, long long K, const double* __restrict__ w,
                                  const double* __restrict__ bsum, double divisor, Post post) {
  const long long m = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (m >= M) return;  // m is the same for the whole warp
  const float* row = x + m * K;
  double acc = 0.0;
#pragma unroll 8
  for (long long k = lane; k < K; k += 32) acc = fma(static_cast<double>(row[k]), w[k], acc);
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) post(post.column(0), m, 0, static_cast<float>((acc + (bsum != nullptr ? bsum[0] : 0.0)) / divisor));
}

template <class Post>
int kf_row_dot(const float* x, long long M, long long K, const double* w, const double* bsum, double divisor,
               const Post& post, cudaStream_t stream) {
  if (M == 0) return 0;
  const long long block = 256, threads = M * 32;
  kf_row_dot_kernel<Post><<<static_cast<unsigned>((threads + block - 1) / block), block, 0, stream>>>(
      x, M, K, w, bsum, divisor, post);
  return static_cast<int>(cudaGetLastError());
}
"""

ROWS = r"""
constexpr int KF_ROW_THREADS = 256;

// NaN-propagating max / min of two values (either NaN gives NaN), as torch's amax / amin reduce (host too: the pool's
// per-value function runs on the CPU in tests)
__host__ __device__ __forceinline__ float kf_nan_max(float a, float b) {
  return (a != a || b != b) ? a + b : fmaxf(a, b);
}
__host__ __device__ __forceinline__ float kf_nan_min(float a, float b) {
  return (a != a || b != b) ? a + b : fminf(a, b);
}

// The block's reduction of v (op 0 sum, 1 max, 2 min): every thread gets the result. `scratch` holds 32 values.
template <int OP, class T>
__device__ T kf_block_reduce(T v, T* scratch) {
  for (int o = 16; o > 0; o /= 2) {
    const T w = __shfl_xor_sync(0xffffffffu, v, o);
    v = OP == 0 ? v + w : OP == 1 ? kf_nan_max(v, w) : kf_nan_min(v, w);
  }
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // scratch may still be read from the previous reduction
  if (threadIdx.x % 32 == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int i = 1; i < warps; ++i) {
    const T w = scratch[i];
    v = OP == 0 ? v + w : OP == 1 ? kf_nan_max(v, w) : kf_nan_min(v, w);
  }
  return v;
}

template <int STAT>
__global__ void __launch_bounds__(KF_ROW_THREADS) kf_row_stats_kernel(const float* __restrict__ y, long long N,
                                                                     double divisor, float eps,
                                                                     float* __restrict__ st_a,
                                                                     float* __restrict__ st_b) {
  __shared__ double scratch_d[32];
  __shared__ float scratch_f[32];
  const long long m = blockIdx.x;
  const float* row = y + m * N;
  if (STAT == 0 || STAT == 4) {
    double s = 0.0;
    for (long long n = threadIdx.x; n < N; n += blockDim.x) s += row[n];
    s = kf_block_reduce<0>(s, scratch_d);
    if (STAT == 0) {
      if (threadIdx.x == 0) st_a[m] = static_cast<float>(s / divisor);
      return;
    }
    const double mean = s / N;
    double q = 0.0;
    for (long long n = threadIdx.x; n < N; n += blockDim.x) {
      const double d = row[n] - mean;
      q += d * d;
    }
    q = kf_block_reduce<0>(q, scratch_d);
    if (threadIdx.x == 0) {
      st_a[m] = static_cast<float>(mean);
      st_b[m] = static_cast<float>(1.0 / sqrt(q / N + static_cast<double>(eps)));
    }
    return;
  }
  float v = STAT == 2 ? INFINITY : -INFINITY;
  for (long long n = threadIdx.x; n < N; n += blockDim.x) v = STAT == 2 ? kf_nan_min(v, row[n]) : kf_nan_max(v, row[n]);
  v = STAT == 2 ? kf_block_reduce<2>(v, scratch_f) : kf_block_reduce<1>(v, scratch_f);
  if (STAT != 3) {
    if (threadIdx.x == 0) st_a[m] = v;
    return;
  }
  float s = 0.0f;  // logsumexp: sum of exp(y - max), max finite (an infinite or NaN max is the result itself)
  if (isfinite(v))
    for (long long n = threadIdx.x; n < N; n += blockDim.x) s += expf(row[n] - v);
  s = kf_block_reduce<0>(s, scratch_f);
  if (threadIdx.x == 0) st_a[m] = isfinite(v) ? v + logf(s) : v;
}

// (a template, so a translation unit compiles only the statistics its regions use)
template <int STAT>
int kf_row_stats(const float* y, long long M, long long N, double divisor, float eps, float* st_a, float* st_b,
                 cudaStream_t stream) {
  if (M == 0) return 0;
  kf_row_stats_kernel<STAT><<<static_cast<unsigned>(M), KF_ROW_THREADS, 0, stream>>>(y, N, divisor, eps, st_a, st_b);
  return static_cast<int>(cudaGetLastError());
}

template <class Row>
__global__ void kf_rows_kernel(long long M, long long columns, const float* __restrict__ st_a, Row row) {
  const long long m = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (m < M) row(row.column(m % columns), m, 0, st_a[m]);
}

template <class Row>
int kf_rows(long long M, const float* st_a, const Row& row, cudaStream_t stream, long long columns = 1) {
  if (M == 0) return 0;
  kf_rows_kernel<Row><<<static_cast<unsigned>((M + 255) / 256), 256, 0, stream>>>(M, columns, st_a, row);
  return static_cast<int>(cudaGetLastError());
}

template <class Post>
__global__ void kf_rows_apply_kernel(const float* __restrict__ y, long long M, long long N, long long rows, Post post) {
  const long long n = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const auto c = post.column(n);
  const long long r0 = static_cast<long long>(blockIdx.y) * rows, r1 = min(M, r0 + rows);
#pragma unroll 4
  for (long long m = r0; m < r1; ++m) post(c, m, n, y[m * N + n]);
}

template <class Post>
int kf_rows_apply(const float* y, long long M, long long N, const Post& post, cudaStream_t stream) {
  if (M == 0 || N == 0) return 0;
  const unsigned col_blocks = static_cast<unsigned>((N + 255) / 256);
  const long long chunks = kf_row_chunks(M, col_blocks), rows = (M + chunks - 1) / chunks;
  kf_rows_apply_kernel<Post><<<dim3(col_blocks, static_cast<unsigned>(chunks)), 256, 0, stream>>>(y, M, N, rows, post);
  return static_cast<int>(cudaGetLastError());
}

template <bool MAX, class Post>
__global__ void kf_pool_kernel(const float* __restrict__ y, long long M, long long N, int k, long long N_out,
                               long long rows, Post post) {
  const long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= N_out) return;
  const auto c = post.column(j);
  const long long r0 = static_cast<long long>(blockIdx.y) * rows, r1 = min(M, r0 + rows);
  for (long long m = r0; m < r1; ++m) {
    const float* w = y + m * N + j * k;
    float v = w[0];
    for (int i = 1; i < k; ++i) v = MAX ? kf_nan_max(v, w[i]) : v + w[i];
    post(c, m, j, MAX ? v : v / k);
  }
}

template <bool MAX, class Post>
int kf_pool(const float* y, long long M, long long N, int k, const Post& post, cudaStream_t stream) {
  const long long N_out = N / k;
  if (M == 0 || N_out == 0) return 0;
  const unsigned col_blocks = static_cast<unsigned>((N_out + 255) / 256);
  const long long chunks = kf_row_chunks(M, col_blocks), rows = (M + chunks - 1) / chunks;
  kf_pool_kernel<MAX, Post><<<dim3(col_blocks, static_cast<unsigned>(chunks)), 256, 0, stream>>>(y, M, N, k, N_out,
                                                                                                  rows, post);
  return static_cast<int>(cudaGetLastError());
}
"""
