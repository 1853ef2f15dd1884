"""The fixed CUDA C++ of the row-sum kind (kfuse/cuda/rowsum.py): a float64 dot product of each row of x with a
vector, then the region's per-row functor."""

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
