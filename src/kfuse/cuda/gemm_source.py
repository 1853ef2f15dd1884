"""The fixed CUDA C++ of the backend: what every generated file's CUDA_SRC and CPP_SRC hold besides its epilogues.

out = x @ W^T (+ the region's epilogue) with x (M, K) and W (N, K) fp32, accurate to fp32 on the fp16 tensor
cores, by the same split as the Triton tile (kfuse/kernels/gemm_core.py says why it is exact):
  kf_split_rows_kernel  one block per row: s = a power of two putting max|row| in [2^14, 2^15) (from the exponent
                        bits: exact), hi = fp16(v s), lo = fp16(v s - hi), each zero-padded to CP = a multiple
                        of KF_PAD_K columns so that every K block of the GEMM loads unmasked, written as one row
                        [hi | lo] of 2 CP (both GEMM tiles read it). Reads the row twice (the second time mostly
                        from L1/L2), writes 4 bytes per element; 16-byte loads and 8-byte stores where the row is
                        contiguous, 16-byte aligned and C % 4 == 0.
  kf_gemm_fp16x3p_kernel  (GPUs other than sm_90, or no CUTLASS headers) 128 x 128 output tiles, 8 warps of
                        64 x 32 (nvcuda::wmma m16n16k16 fragments), K in
                        blocks of 32 through a 2- or 3-stage cp.async ring in shared memory. Each K block's three
                        products lo*hi, hi*lo, hi*hi (lo*lo is below fp32's last bit) go into a FRESH fragment that
                        is then added into the fp32 register accumulator with a round-to-nearest FADD: the tensor
                        core truncates when it accumulates, and a partial that never grows keeps that tiny
                        (the Triton tile's "promotion"). Then the tile goes through shared memory, so that each
                        lane owns one output column: the row and column scales are undone (exact powers of two)
                        and the region's epilogue functor runs on every element, stores coalesced.
                        hi and lo are read from their segments (rows 2 CP apart).
                        Flops: 3 x 2 M N K on tensor cores. Bytes: x's and W's parts (2 + 2 bytes per element
                        each) read once per tile row / column (tiles in groups of 8 rows, so W's columns are
                        shared through L2), the outputs written once.
  kf_gemm_cuda_core_kernel  scheme "ieee" with more than SKINNY_M rows: 64 x 64 tiles on the CUDA cores, the fp32
                        operands widened to double in shared memory, each output one double FMA chain in k order,
                        rounded to fp32 once (plain fp32 sums missed rule 3 against cuBLAS at 37 x 70 -> 129 on an
                        H100: 6.68e-07 against a bound of 6.58e-07).
  kf_gemv_kernel        GEMMs of at most SKINNY_M rows (a batch of 1), any scheme but fp16x3p's split (the Python
                        launcher passes "fp64" for them): memory-bound on W, read once and coalesced, x's rows in
                        shared memory, double sums per lane, a warp butterfly, fp32 rounding once, the epilogue.
                        fp16x3p's ~3e-7 relative error failed rule 3 against cuBLAS's GEMV at batch 1.
On sm_90 with CUTLASS's headers, fp16x3p GEMMs of more than SKINNY_M rows run kf_launch_sm90 instead
(gemm_sm90_source.py: TMA, wgmma, a producer warp; the same epilogue functor).
Edges are handled by clamping loads to the last row / column (their results are never stored) and masking the
stores; any M, N, K works. Host glue: `kf_gemm` picks the kernel for a KfGemmArgs; each region adds its epilogue
struct (spellings.py) and one launcher calling kf_gemm with it (epilogue.region_sources). glue.py assembles the
translation units and holds the C++ side's helpers.

torch builds CUDA with -D__CUDA_NO_HALF_CONVERSIONS__: every fp16 conversion here is an explicit intrinsic.
"""

from __future__ import annotations

from kfuse.cuda.gemm_sm90_source import GEMM_SM90

BLOCK_K = 32  # the WMMA tile's K block
PAD_K = 64  # split rows are zero-padded to a multiple of this: a whole number of the WMMA and Hopper tiles' K blocks
SKINNY_M = 16  # GEMMs of at most this many rows run kf_gemv_kernel (float64 sums; the Triton path's SKINNY_M)
SCHEME_IDS = {"fp16x3p": 0, "ieee": 1, "fp64": 2}  # KfGemmArgs.scheme

# Shared by both translation units (identical text, so one definition as far as the linker cares).
COMMON = r"""
#include <cuda_runtime_api.h>

// The operands of one GEMM out = a @ b^T: scheme 0 (fp16x3p): a (M, 2K) and b (N, 2K) = [hi | lo], the fp16 parts
// of x and W (kf_split_rows) with per-row power-of-two scales, K = CP a multiple of KF_PAD_K; schemes 1 and 2 (fp64
// sums): a (M, K) and b (N, K) fp32, the scales unused. All row-major and contiguous. `batch` independent products
// (a batched product x @ y): a holds batch x M rows and b batch x N rows, product p's rows after p's predecessors'
// (its scales likewise), and out's rows p M .. p M + M - 1 are product p's (the epilogue sees those row numbers).
struct KfGemmArgs {
  int scheme;
  long long M, N, K;
  const void* a;
  const float* a_scale;
  const void* b;
  const float* b_scale;
  long long batch = 1;
};

int kf_split_rows(const float* x, long long stride_r, long long stride_c, long long R, long long C, long long CP,
                  void* parts, float* scale, cudaStream_t stream);
"""

PRELUDE = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <mma.h>

// max / min that keep a NaN of their first operand (torch's relu, clamp and hardtanh propagate NaN; fmaxf alone
// would turn it into the other operand)
__device__ __forceinline__ float kf_max(float a, float b) { return a != a ? a : fmaxf(a, b); }
__device__ __forceinline__ float kf_min(float a, float b) { return a != a ? a : fminf(a, b); }
__device__ __forceinline__ float kf_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double kf_fma(double a, double b, double c) { return fma(a, b, c); }

// s = 2^(14 - floor(log2 amax)) from amax's exponent bits (exact), clamped so that s and 1/s stay normal
// (zero, subnormal and inf rows): the same bits as the Triton tile's _pow2_scale
__device__ __forceinline__ float kf_pow2_scale(float amax) {
  const int e = (__float_as_int(amax) >> 23) & 0xFF;
  const int field = min(max(127 + 14 + 127 - e, 2), 252);
  return __int_as_float(field << 23);
}

// 1/s for a power of two s made by kf_pow2_scale (exact, no division)
__device__ __forceinline__ float kf_pow2_inv(float s) {
  const int e = (__float_as_int(s) >> 23) & 0xFF;
  return __int_as_float((254 - e) << 23);
}
"""

SPLIT = r"""
// One block per row: s[row] = kf_pow2_scale(max |x[row, :]|), hi = fp16(x s), lo = fp16(x s - hi), zeros in
// columns C..CP, stored as the row [hi | lo] of 2 CP. VEC: float4 loads and 4-half stores (the host checks that the
// row is contiguous and 16-byte aligned and C % 4 == 0; CP % 4 == 0 always). |x s| < 2^15 < 65504: no overflow.
__device__ __forceinline__ unsigned kf_half_pair(__half a, __half b) {
  return (unsigned)__half_as_ushort(a) | ((unsigned)__half_as_ushort(b) << 16);
}

template <bool VEC>
__global__ void __launch_bounds__(256) kf_split_rows_kernel(const float* __restrict__ x, long long stride_r,
                                                            long long stride_c, int C, int CP,
                                                            __half* __restrict__ parts, float* __restrict__ scale) {
  __shared__ float warp_max[32];
  const long long row = blockIdx.x;
  const float* xr = x + row * stride_r;
  float m = 0.0f;
  if (VEC) {
    for (int c = 4 * threadIdx.x; c < C; c += 4 * blockDim.x) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(xr + c));
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
  } else {
    for (int c = threadIdx.x; c < C; c += blockDim.x) m = fmaxf(m, fabsf(xr[c * stride_c]));
  }
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = threadIdx.x < blockDim.x / 32 ? warp_max[threadIdx.x] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, off));
    if (threadIdx.x == 0) warp_max[0] = w;
  }
  __syncthreads();
  const float s = kf_pow2_scale(warp_max[0]);
  if (threadIdx.x == 0) scale[row] = s;
  __half* hr = parts + row * 2 * CP;
  __half* lr = hr + CP;
  if (VEC) {
    for (int c = 4 * threadIdx.x; c < CP; c += 4 * blockDim.x) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (c < C) v = __ldg(reinterpret_cast<const float4*>(xr + c));
      const float e[4] = {v.x * s, v.y * s, v.z * s, v.w * s};
      __half h[4], l[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        h[i] = __float2half_rn(e[i]);
        l[i] = __float2half_rn(e[i] - __half2float(h[i]));
      }
      *reinterpret_cast<uint2*>(hr + c) = make_uint2(kf_half_pair(h[0], h[1]), kf_half_pair(h[2], h[3]));
      *reinterpret_cast<uint2*>(lr + c) = make_uint2(kf_half_pair(l[0], l[1]), kf_half_pair(l[2], l[3]));
    }
  } else {
    for (int c = threadIdx.x; c < CP; c += blockDim.x) {
      const float v = c < C ? xr[c * stride_c] * s : 0.0f;
      const __half h = __float2half_rn(v);
      hr[c] = h;
      lr[c] = __float2half_rn(v - __half2float(h));
    }
  }
}

int kf_split_rows(const float* x, long long stride_r, long long stride_c, long long R, long long C, long long CP,
                  void* parts, float* scale, cudaStream_t stream) {
  if (R == 0) return 0;
  const bool vec = stride_c == 1 && C % 4 == 0 && stride_r % 4 == 0 && reinterpret_cast<size_t>(x) % 16 == 0;
  if (vec)
    kf_split_rows_kernel<true><<<(unsigned)R, 256, 0, stream>>>(x, stride_r, stride_c, (int)C, (int)CP,
                                                                static_cast<__half*>(parts), scale);
  else
    kf_split_rows_kernel<false><<<(unsigned)R, 256, 0, stream>>>(x, stride_r, stride_c, (int)C, (int)CP,
                                                                 static_cast<__half*>(parts), scale);
  return (int)cudaGetLastError();
}
"""

GEMM = r"""
constexpr int KF_BM = 128, KF_BN = 128, KF_BK = BLOCK_K_VALUE;
constexpr int KF_WARPS_M = 2, KF_WARPS_N = 4;
constexpr int KF_THREADS = 32 * KF_WARPS_M * KF_WARPS_N;  // 256
constexpr int KF_WM = KF_BM / KF_WARPS_M;                 // 64 rows per warp
constexpr int KF_WN = KF_BN / KF_WARPS_N;                 // 32 columns per warp
constexpr int KF_FM = KF_WM / 16, KF_FN = KF_WN / 16;      // 4 x 2 fragments of 16 x 16 per warp
constexpr int KF_LDS = KF_BK + 8;     // shared row stride in halves: 80 bytes, a multiple of 16 (wmma), and
                                      // 8 consecutive rows start in 8 different bank quads (no conflicts)
constexpr int KF_PART = KF_BM * KF_LDS;  // halves of one operand part (a hi, a lo, b hi, b lo) in one stage
constexpr int KF_STAGE = 4 * KF_PART;
constexpr int KF_GROUP_M = 8;         // tile rows per group: a group's tiles share W's column blocks in L2
constexpr int KF_CHUNKS = KF_BM * KF_BK / 8 / KF_THREADS;  // 16-byte copies per thread per operand part
static_assert(KF_BM == KF_BN, "kf_load_stage copies rows of a and b with one index");
static_assert(KF_BK % 16 == 0 && KF_CHUNKS * KF_THREADS * 8 == KF_BM * KF_BK, "K block shape");

__host__ __device__ constexpr size_t kf_smem_bytes(int stages) { return (size_t)stages * KF_STAGE * sizeof(__half); }
static_assert(kf_smem_bytes(2) >= (size_t)KF_BM * KF_BN * sizeof(float), "the epilogue's staging fits");

__device__ __forceinline__ void kf_cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *static_cast<int4*>(smem) = *static_cast<const int4*>(gmem);
#endif
}

__device__ __forceinline__ void kf_cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void kf_cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// One K block of the four parts (rows ld halves apart) into shared stage `st`: rows past M (N) read the last row
// (never stored).
__device__ __forceinline__ void kf_load_stage(__half* st, const __half* __restrict__ a_hi,
                                              const __half* __restrict__ a_lo, const __half* __restrict__ b_hi,
                                              const __half* __restrict__ b_lo, int row0, int col0, int M, int N,
                                              long long ld, int k0) {
#pragma unroll
  for (int i = 0; i < KF_CHUNKS; ++i) {
    const int c = threadIdx.x + i * KF_THREADS;
    const int r = c / (KF_BK / 8);
    const int kc = (c % (KF_BK / 8)) * 8;
    const long long ga = (long long)min(row0 + r, M - 1) * ld + k0 + kc;
    const long long gb = (long long)min(col0 + r, N - 1) * ld + k0 + kc;
    const int s = r * KF_LDS + kc;
    kf_cp_async16(st + s, a_hi + ga);
    kf_cp_async16(st + KF_PART + s, a_lo + ga);
    kf_cp_async16(st + 2 * KF_PART + s, b_hi + gb);
    kf_cp_async16(st + 3 * KF_PART + s, b_lo + gb);
  }
}

// One K block (KF_BK deep) of shared stage `st` into warp (wm, wn)'s accumulator: the block's three products
// lo*hi, hi*lo, hi*hi (lo*lo is below fp32's last bit) go into a FRESH fragment that is then added into the fp32
// register accumulator with a round-to-nearest FADD (the tensor core truncates when it accumulates, and a partial
// that never grows keeps that tiny: the Triton tile's "promotion").
using KfAcc = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// a: the stage's a hi part (its lo part a_part halves on), b: its b hi part (lo b_part on); a block BK deep, rows
// LDS halves apart
template <int BK, int LDS>
__device__ __forceinline__ void kf_mma_stage(const __half* a, int a_part, const __half* b, int b_part, int wm, int wn,
                                             KfAcc (&acc)[KF_FM][KF_FN]) {
  using namespace nvcuda;
  KfAcc part[KF_FM][KF_FN];
#pragma unroll
  for (int i = 0; i < KF_FM; ++i)
#pragma unroll
    for (int j = 0; j < KF_FN; ++j) wmma::fill_fragment(part[i][j], 0.0f);
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> bh[KF_FN], bl[KF_FN];
#pragma unroll
    for (int j = 0; j < KF_FN; ++j) {  // b's rows are W's rows (N, K): W^T column-major
      const __half* pb = b + (wn * KF_WN + j * 16) * LDS + kk;
      wmma::load_matrix_sync(bh[j], pb, LDS);
      wmma::load_matrix_sync(bl[j], pb + b_part, LDS);
    }
#pragma unroll
    for (int i = 0; i < KF_FM; ++i) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> ah, al;
      const __half* pa = a + (wm * KF_WM + i * 16) * LDS + kk;
      wmma::load_matrix_sync(ah, pa, LDS);
      wmma::load_matrix_sync(al, pa + a_part, LDS);
#pragma unroll
      for (int j = 0; j < KF_FN; ++j) {  // the small products first
        wmma::mma_sync(part[i][j], al, bh[j], part[i][j]);
        wmma::mma_sync(part[i][j], ah, bl[j], part[i][j]);
        wmma::mma_sync(part[i][j], ah, bh[j], part[i][j]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < KF_FM; ++i)
#pragma unroll
    for (int j = 0; j < KF_FN; ++j)
#pragma unroll
      for (int t = 0; t < acc[i][j].num_elements; ++t) acc[i][j].x[t] += part[i][j].x[t];  // promotion
}

template <int STAGES, class Epi>
__global__ void __launch_bounds__(KF_THREADS) kf_gemm_fp16x3p_kernel(
    const __half* __restrict__ a_hi, const __half* __restrict__ a_lo, const float* __restrict__ a_scale,
    const __half* __restrict__ b_hi, const __half* __restrict__ b_lo, const float* __restrict__ b_scale,
    int M, int N, long long K, Epi epi) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char kf_smem[];
  __half* smem = reinterpret_cast<__half*>(kf_smem);

  // grouped tile order (as the Triton tile's _tile_ids) within a product; a batch's products one after another
  const int tiles_m = (M + KF_BM - 1) / KF_BM, tiles_n = (N + KF_BN - 1) / KF_BN;
  const long long product = blockIdx.x / (tiles_m * tiles_n);
  const int pid = blockIdx.x % (tiles_m * tiles_n);
  a_hi += product * M * 2 * K;
  a_lo += product * M * 2 * K;
  a_scale += product * M;
  b_hi += product * N * 2 * K;
  b_lo += product * N * 2 * K;
  b_scale += product * N;
  const int width = KF_GROUP_M * tiles_n;
  const int first_m = (pid / width) * KF_GROUP_M;
  const int group_m = min(tiles_m - first_m, KF_GROUP_M);
  const int pid_m = first_m + (pid % width) % group_m;
  const int pid_n = (pid % width) / group_m;
  const int row0 = pid_m * KF_BM, col0 = pid_n * KF_BN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / KF_WARPS_N, wn = warp % KF_WARPS_N;

  KfAcc acc[KF_FM][KF_FN];
#pragma unroll
  for (int i = 0; i < KF_FM; ++i)
#pragma unroll
    for (int j = 0; j < KF_FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  const int KT = (int)(K / KF_BK);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) kf_load_stage(smem + s * KF_STAGE, a_hi, a_lo, b_hi, b_lo, row0, col0, M, N, 2 * K, s * KF_BK);
    kf_cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    kf_cp_async_wait<STAGES - 2>();  // K block kt has landed (this thread's copies) ...
    __syncthreads();                 // ... everyone's, and every warp is done with the stage refilled next
    const int next = kt + STAGES - 1;
    if (next < KT)
      kf_load_stage(smem + (next % STAGES) * KF_STAGE, a_hi, a_lo, b_hi, b_lo, row0, col0, M, N, 2 * K,
                    next * KF_BK);
    kf_cp_async_commit();

    const __half* st = smem + (kt % STAGES) * KF_STAGE;  // a hi, a lo, b hi, b lo
    kf_mma_stage<KF_BK, KF_LDS>(st, KF_PART, st + 2 * KF_PART, KF_PART, wm, wn, acc);
  }
  kf_cp_async_wait<0>();
  __syncthreads();  // the ring is idle: its shared memory now stages each warp's 64 x 32 fp32 tile

  float* tile = reinterpret_cast<float*>(kf_smem) + warp * (KF_WM * KF_WN);
#pragma unroll
  for (int i = 0; i < KF_FM; ++i)
#pragma unroll
    for (int j = 0; j < KF_FN; ++j)
      wmma::store_matrix_sync(tile + (i * 16) * KF_WN + j * 16, acc[i][j], KF_WN, wmma::mem_row_major);
  __syncwarp();
  const int n = col0 + wn * KF_WN + lane;  // this lane's column: stores of a warp cover 128 contiguous bytes
  if (n < N) {
    const float inv_b = kf_pow2_inv(b_scale[n]);
    const typename Epi::Col col = epi.column(n);
    const int m0 = row0 + wm * KF_WM;
    for (int r = 0; r < KF_WM && m0 + r < M; ++r) {
      const int m = m0 + r;
      epi(col, product * M + m, n, tile[r * KF_WN + lane] * kf_pow2_inv(a_scale[m]) * inv_b);
    }
  }
}

constexpr int KF_CB = 64, KF_CK = 16;  // CUDA-core tile: 64 x 64 outputs, K steps of 16, 256 threads x 4 x 4

// Schemes 1 and 2 with more than KF_GEMV_M rows: the fp32 operands are widened to double as they are staged in
// shared memory (a product of two fp32 values is exact in double), each output is one double FMA chain in k order
// (k = 0, 1, ..., K-1), rounded to fp32 once before the epilogue. tests/test_cuda_backend.py models this order.
template <class Epi>
__global__ void __launch_bounds__(256) kf_gemm_cuda_core_kernel(const float* __restrict__ a,
                                                                const float* __restrict__ b, int M, int N,
                                                                long long K, Epi epi) {
  __shared__ double as[KF_CK][KF_CB + 1];  // + 1: the staging stores (k fastest) hit distinct banks
  __shared__ double bs[KF_CK][KF_CB + 1];
  const int tiles_n = (N + KF_CB - 1) / KF_CB, tiles = (M + KF_CB - 1) / KF_CB * tiles_n;
  const long long product = blockIdx.x / tiles;  // a batch's products one after another (KfGemmArgs)
  const int tile = blockIdx.x % tiles;
  const int row0 = (tile / tiles_n) * KF_CB, col0 = (tile % tiles_n) * KF_CB;
  a += product * M * K;
  b += product * N * K;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  double acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
  for (long long k0 = 0; k0 < K; k0 += KF_CK) {
    for (int e = threadIdx.x; e < KF_CB * KF_CK; e += 256) {
      const int r = e / KF_CK, k = e % KF_CK;
      const long long gk = k0 + k;
      as[k][r] = (row0 + r < M && gk < K) ? (double)a[(long long)(row0 + r) * K + gk] : 0.0;
      bs[k][r] = (col0 + r < N && gk < K) ? (double)b[(long long)(col0 + r) * K + gk] : 0.0;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < KF_CK; ++k) {
      double av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        av[i] = as[k][ty + 16 * i];
        bv[i] = bs[k][tx + 16 * i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int n = col0 + tx + 16 * j;
    if (n >= N) continue;
    const typename Epi::Col col = epi.column(n);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = row0 + ty + 16 * i;
      if (m < M) epi(col, product * M + m, n, static_cast<float>(acc[i][j]));
    }
  }
}

// GEMV for few rows (M <= KF_GEMV_M; schemes 1 and 2): out = x W^T, x (M, K), W (N, K) fp32, memory-bound on W.
// Each warp owns KF_GV_R rows of W (output columns n0, n0 + 1) and reads each of them once, coalesced: lane l takes
// the VEC-wide pieces k = VEC (l + 32 j) (float4 loads where K % 4 == 0 and both pointers are 16-byte aligned,
// else single floats). x's rows, padded with zero rows to MT (1, 4 or 16), are staged in shared memory KC columns
// at a time (MT * KC <= KF_GV_SMEM floats: 32 KiB; KC a multiple of 32 VEC, so lane l's pieces are the same in
// every chunk) and read by all 8 warps. Each lane keeps MT x KF_GV_R double sums (products of fp32 values are
// exact in double; FMAs in increasing k), then a butterfly of __shfl_xor_sync (offsets 16, 8, 4, 2, 1: a fixed
// pairwise tree, every lane ends with the same bits) gives the totals, each rounded to fp32 once and passed to the
// epilogue by one lane; stores masked to m < M, n < N. The same bits every run. tests/test_cuda_backend.py models
// this order (gemv_model) and the GPU test compares the kernel with it bit for bit.
constexpr int KF_GEMV_M = SKINNY_M_VALUE, KF_GV_THREADS = 256, KF_GV_WARPS = KF_GV_THREADS / 32, KF_GV_R = 2;
constexpr int KF_GV_SMEM = 8192;  // floats of x staged per block (32 KiB: up to 7 blocks per SM)

template <int MT, int VEC, class Epi>
__global__ void __launch_bounds__(KF_GV_THREADS) kf_gemv_kernel(const float* __restrict__ x,
                                                                const float* __restrict__ w, int M, int N,
                                                                long long K, int KC, Epi epi) {
  extern __shared__ __align__(16) float kf_xs[];  // MT x KC: x[:, k0:k0 + KC], rows M..MT-1 zero
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int blocks = (N + KF_GV_WARPS * KF_GV_R - 1) / (KF_GV_WARPS * KF_GV_R);
  const long long product = blockIdx.x / blocks;  // a batch's products one after another (KfGemmArgs)
  x += product * M * K;
  w += product * N * K;
  const int n0 = (blockIdx.x % blocks * KF_GV_WARPS + warp) * KF_GV_R;
  const float* wr[KF_GV_R];
#pragma unroll
  for (int r = 0; r < KF_GV_R; ++r) wr[r] = w + (long long)min(n0 + r, N - 1) * K;  // past N: never stored
  double acc[MT][KF_GV_R];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < KF_GV_R; ++r) acc[m][r] = 0.0;

  for (long long k0 = 0; k0 < K; k0 += KC) {
    const int kc = (int)min((long long)KC, K - k0);
    __syncthreads();  // every warp is done with the previous chunk
#pragma unroll 4
    for (int e = threadIdx.x * VEC; e < MT * KC; e += KF_GV_THREADS * VEC) {
      const int m = e / KC, k = e % KC;  // VEC divides KC: a piece never crosses a row
      if (VEC == 4) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (m < M && k < kc) v = __ldg(reinterpret_cast<const float4*>(x + (long long)m * K + k0 + k));
        *reinterpret_cast<float4*>(kf_xs + e) = v;
      } else {
        kf_xs[e] = (m < M && k < kc) ? __ldg(x + (long long)m * K + k0 + k) : 0.0f;
      }
    }
    __syncthreads();
    if (n0 >= N) continue;  // a warp past the last row (whole warp: no shuffle divergence)
#pragma unroll 2
    for (int j = lane * VEC; j < kc; j += 32 * VEC) {
      if (VEC == 4) {
        float4 wv[KF_GV_R];
#pragma unroll
        for (int r = 0; r < KF_GV_R; ++r) wv[r] = __ldg(reinterpret_cast<const float4*>(wr[r] + k0 + j));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const float4 xv = *reinterpret_cast<const float4*>(kf_xs + m * KC + j);
#pragma unroll
          for (int r = 0; r < KF_GV_R; ++r) {
            acc[m][r] = fma((double)xv.x, (double)wv[r].x, acc[m][r]);
            acc[m][r] = fma((double)xv.y, (double)wv[r].y, acc[m][r]);
            acc[m][r] = fma((double)xv.z, (double)wv[r].z, acc[m][r]);
            acc[m][r] = fma((double)xv.w, (double)wv[r].w, acc[m][r]);
          }
        }
      } else {
        float wv[KF_GV_R];
#pragma unroll
        for (int r = 0; r < KF_GV_R; ++r) wv[r] = __ldg(wr[r] + k0 + j);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const double xv = (double)kf_xs[m * KC + j];
#pragma unroll
          for (int r = 0; r < KF_GV_R; ++r) acc[m][r] = fma(xv, (double)wv[r], acc[m][r]);
        }
      }
    }
  }
  if (n0 >= N) return;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < KF_GV_R; ++r)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], off);
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < KF_GV_R; ++r) {
      const int n = n0 + r;
      if (lane == (m * KF_GV_R + r) % 32 && m < M && n < N)
        epi(epi.column(n), product * M + m, n, static_cast<float>(acc[m][r]));
    }
}

template <int STAGES, class Epi>
cudaError_t kf_launch_fp16x3p(const KfGemmArgs& g, const Epi& epi, cudaStream_t stream) {
  auto kernel = kf_gemm_fp16x3p_kernel<STAGES, Epi>;
  const size_t smem = kf_smem_bytes(STAGES);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return err;
  const long long tiles = ((g.M + KF_BM - 1) / KF_BM) * ((g.N + KF_BN - 1) / KF_BN) * g.batch;
  const __half* a = static_cast<const __half*>(g.a);  // [hi | lo]
  const __half* b = static_cast<const __half*>(g.b);
  kernel<<<(unsigned)tiles, KF_THREADS, smem, stream>>>(a, a + g.K, g.a_scale, b, b + g.K, g.b_scale, (int)g.M,
                                                        (int)g.N, g.K, epi);
  return cudaGetLastError();
}

template <class Epi>
cudaError_t kf_launch_cuda_core(const KfGemmArgs& g, const Epi& epi, cudaStream_t stream) {
  const long long tiles = ((g.M + KF_CB - 1) / KF_CB) * ((g.N + KF_CB - 1) / KF_CB) * g.batch;
  kf_gemm_cuda_core_kernel<Epi><<<(unsigned)tiles, 256, 0, stream>>>(
      static_cast<const float*>(g.a), static_cast<const float*>(g.b), (int)g.M, (int)g.N, g.K, epi);
  return cudaGetLastError();
}

// x's chunk width for MT padded rows of VEC-wide pieces: a multiple of 32 VEC, MT * KC <= KF_GV_SMEM, no wider
// than K needs
__host__ __device__ constexpr long long kf_gemv_chunk(int MT, int VEC, long long K) {
  return (K + 32 * VEC - 1) / (32 * VEC) * (32 * VEC) < KF_GV_SMEM / MT / (32 * VEC) * (32 * VEC)
             ? (K + 32 * VEC - 1) / (32 * VEC) * (32 * VEC)
             : KF_GV_SMEM / MT / (32 * VEC) * (32 * VEC);
}

template <int MT, int VEC, class Epi>
cudaError_t kf_launch_gemv_t(const KfGemmArgs& g, const Epi& epi, cudaStream_t stream) {
  const long long kc = kf_gemv_chunk(MT, VEC, g.K);
  const long long rows = (long long)KF_GV_WARPS * KF_GV_R;
  kf_gemv_kernel<MT, VEC, Epi><<<(unsigned)((g.N + rows - 1) / rows * g.batch), KF_GV_THREADS, MT * kc * sizeof(float),
                                 stream>>>(static_cast<const float*>(g.a), static_cast<const float*>(g.b), (int)g.M,
                                           (int)g.N, g.K, (int)kc, epi);
  return cudaGetLastError();
}

template <int VEC, class Epi>
cudaError_t kf_launch_gemv_v(const KfGemmArgs& g, const Epi& epi, cudaStream_t stream) {
  if (g.M <= 1) return kf_launch_gemv_t<1, VEC>(g, epi, stream);
  if (g.M <= 4) return kf_launch_gemv_t<4, VEC>(g, epi, stream);
  return kf_launch_gemv_t<KF_GEMV_M, VEC>(g, epi, stream);
}

// float4 pieces where every row of x and W starts 16-byte aligned
template <class Epi>
cudaError_t kf_launch_gemv(const KfGemmArgs& g, const Epi& epi, cudaStream_t stream) {
  const bool vec = g.K % 4 == 0 && reinterpret_cast<size_t>(g.a) % 16 == 0 && reinterpret_cast<size_t>(g.b) % 16 == 0;
  return vec ? kf_launch_gemv_v<4>(g, epi, stream) : kf_launch_gemv_v<1>(g, epi, stream);
}

GEMM_SM90_SOURCE

// The GEMM of `g` with epilogue `epi` on `stream`. fp16x3p: the Hopper kernel where it was built (KF_SM90), the
// GPU is sm_90 and there is one product (it has no batch); else the WMMA tile with 3 pipeline stages where the GPU
// lets a block have their shared memory (sm_80, sm_90: 120 KiB), else 2 (80 KiB).
template <class Epi>
int kf_gemm(const KfGemmArgs& g, const Epi& epi, cudaStream_t stream) {
  if (g.M == 0 || g.N == 0 || g.batch == 0) return 0;
  if (g.scheme != 0 && g.M <= KF_GEMV_M) return (int)kf_launch_gemv(g, epi, stream);
  if (g.scheme != 0) return (int)kf_launch_cuda_core(g, epi, stream);
  int dev = 0, optin = 0, major = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err != cudaSuccess) return (int)err;
#if defined(KF_SM90)
  if (major == 9 && g.batch == 1) return (int)kf_launch_sm90(g, epi, stream);
#endif
  if ((size_t)optin >= kf_smem_bytes(3)) return (int)kf_launch_fp16x3p<3>(g, epi, stream);
  return (int)kf_launch_fp16x3p<2>(g, epi, stream);
}
""".replace("BLOCK_K_VALUE", str(BLOCK_K)).replace("SKINNY_M_VALUE", str(SKINNY_M)) \
    .replace("GEMM_SM90_SOURCE", GEMM_SM90.strip())
