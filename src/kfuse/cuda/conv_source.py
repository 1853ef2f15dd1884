"""The fixed CUDA C++ of `--backend cuda`'s convolution kind (kfuse/cuda/conv.py): a convolution as an implicit GEMM
on the fp16 tensor cores, fp32-accurate by the GEMM's hi/lo split (gemm_source.py), with the region's epilogue
functor on every output element.

  kf_conv_pack         x (B, C, S) fp32 (S = D H W pixels, NC(D)HW as torch stores it) -> records (B S, 2 CP) fp16:
                       per input pixel its C channels times the sample's power of two s[b] (max |x[b]| in [2^14,
                       2^15), as kf_pow2_scale: exact), hi = fp16(v), then lo = fp16(v - hi), each part zero-padded
                       to CP = C rounded up to 8 (CONV_CHANNELS). Two kernels: the samples' max |x|
                       (kf_sample_amax_kernel, an atomicMax on the bits of non-negative floats), then the pack
                       (kf_conv_pack_kernel: 32 pixels x 32 channels a block through shared memory, reads coalesced
                       along the pixels and writes along the channels). Bytes: x read twice, 4 bytes a padded channel
                       written.
  kf_conv_fp16x3p_kernel  the GEMM tile's warp tiles and mainloop (kf_mma_stage: warps of 64 x 32 outputs, K blocks
                       through a cp.async ring, the three products into a fresh partial added in fp32), its rows the
                       output pixels (b, od, oh, ow), its columns the output channels: tiles of 128 x 128 at 8 warps
                       and K blocks of 64 (3 stages, 221 KiB of shared memory on sm_90), or 128 x 64 at 4 warps, K
                       blocks of 32 where C_out <= 64 (no half-empty tiles, two blocks an SM); its K the taps x CP
                       channels rounded up to a K block. Each 16-byte copy is 8 channels of one tap (a K block
                       spans taps where CP is smaller: an 8-channel input does no padded product, a 3-channel one
                       8/3 of them, not 32/3), from one input pixel's record, zero-filled (cp.async's source size 0)
                       where the tap falls in the padding, past the last tap or past M. The weight is (C_out, taps x
                       CP) rows split by kf_split_rows ([hi | lo], per output channel scales), cached on the weight
                       by the Python launcher. Each thread's rows are decoded once (sample, input corner); a K block
                       costs it one tap decode and four bounds checks a row.
                       Epilogue: each warp's 64 x 32 tile goes through shared memory column-major, so that a lane
                       owns an output pixel and a warp's stores of one channel cover 32 consecutive pixels of NC(D)HW;
                       the sample's and the channel's scales are undone (powers of two) and the functor runs at
                       `base + n P` (base = b C_out P + p, P = OD OH OW).
                       Flops: 3 x 2 M C_out taps CP on tensor cores (padding channels to CP costs CP / C of that).
                       Bytes: the records read once per column tile (through L1/L2 across the taps), the output
                       written once.
Groups: each group's channels padded to CP in the records ([group 0 | group 1 | ...] per part), a block's column tile
within one group, its K that group's; any stride, padding, dilation, 1-, 2- or 3-d (as 3-d with unit leading dims).
A transposed convolution is a launch per stride phase (kfuse/cuda/conv_runtime.py: where the launch's pixels land,
its first weight column). Groups of fewer than 8 input channels, depthwise ones among them, run on the direct tile
instead (conv_direct_source.py: one channel a group would pad to 8 and fill one column of a 64-wide tile). The C++
side that checks and builds the launches: conv_operands_source.py.
"""

from __future__ import annotations

# Both translation units: the kernel's arguments and the pack's host function.
CONV_COMMON = r"""
// One launch of the tile (kfuse/cuda/conv_runtime.py): an ordinary convolution (kfuse/kernels/conv_geometry.py's
// sizes, as a 3-d one) whose output pixel (od, oh, ow) lands at (RD + UD od, RH + UH oh, RW + UW ow) of an FD x FH x
// FW output (a transposed convolution's stride phase), its weight rows from column col on.
struct KfConvArgs {
  long long M;  // the launch's output pixels B OD OH OW
  int N;        // output channels
  int G, COUT_G;  // groups, output channels a group
  int CIN_G;    // input channels a group
  int CP;       // CIN_G padded to a multiple of 8; a record's part holds G of them (RW = G CP)
  int D, H, W, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW;
  int FD, FH, FW, RD, RH, RW, UD, UH, UW;  // where the pixels land: the output's dims, the first's place, the steps
  const void* x;         // (B D H W, 2 G CP) fp16 records (kf_conv_pack); the direct tile: x, (B, C, D, H, W) fp32
  const float* x_scale;  // (B,) the samples' powers of two (not the direct tile's)
  const void* w;         // (N, 2 K2) fp16 rows [hi | lo] of the weight's rows (kf_split_rows), from column col on;
                         // the direct tile: the (N, K2) float64 rows
  const float* w_scale;  // (N,) (not the direct tile's)
  long long K;           // taps CP: the K the tile walks, in blocks (zeros past K)
  long long K2;          // the weight's hi part: its rows' length padded to KF_PAD_K = 64 (the direct tile: the rows'
                         // length)
};

int kf_conv_pack(const float* x, long long B, long long C, long long S, long long CIN_G, long long CP,
                 unsigned* amax, void* records, float* scale, cudaStream_t stream);
"""

CONV = r"""
// max |x[b, ...]| over each sample b: blocks (chunk, b), float4 loads where the sample is 16-byte aligned
template <bool VEC>
__global__ void __launch_bounds__(256) kf_sample_amax_kernel(const float* __restrict__ x, long long per_sample,
                                                             unsigned* __restrict__ amax) {
  __shared__ float warp_max[8];
  const float* xs = x + blockIdx.y * per_sample;
  const long long step = 256LL * gridDim.x;
  float m = 0.0f;
  if (VEC) {
    for (long long i = blockIdx.x * 256LL + threadIdx.x; 4 * i < per_sample; i += step) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(xs) + i);
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
  } else {
    for (long long i = blockIdx.x * 256LL + threadIdx.x; i < per_sample; i += step) m = fmaxf(m, fabsf(xs[i]));
  }
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < 8; ++w) m = fmaxf(m, warp_max[w]);
    atomicMax(amax + blockIdx.y, __float_as_uint(m));  // non-negative floats order as their bits
  }
}

// x (B, C, S) -> records (B S, 2 RW), RW = groups x CP: blocks (32 pixels, 32 record columns, b), 8 rows of 32
// threads; record column d holds group d / CP's channel d % CP (zero from CIN_G on)
__global__ void __launch_bounds__(256) kf_conv_pack_kernel(const float* __restrict__ x, int C, long long S, int CIN_G,
                                                           int CP, int RW, const unsigned* __restrict__ amax,
                                                           __half* __restrict__ records, float* __restrict__ scale) {
  __shared__ float t[32][33];  // [column][pixel], + 1: the transposed reads hit distinct banks
  const int b = blockIdx.z, c0 = blockIdx.y * 32, tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const long long s0 = (long long)blockIdx.x * 32;
  const float sc = kf_pow2_scale(__uint_as_float(amax[b]));
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) scale[b] = sc;
  for (int i = ty; i < 32; i += 8) {
    const int d = c0 + i, g = d / CP, cg = d - g * CP;
    const int c = g * CIN_G + cg;  // the source channel
    const long long s = s0 + tx;
    const bool ok = d < RW && cg < CIN_G && c < C && s < S;
    t[i][tx] = ok ? x[((long long)b * C + c) * S + s] * sc : 0.0f;  // exact: sc a power of two
  }
  __syncthreads();
  for (int i = ty; i < 32; i += 8) {
    const long long s = s0 + i;
    if (s >= S) break;
    if (c0 + tx >= RW) continue;
    const float v = t[tx][i];
    const __half h = __float2half_rn(v);
    __half* rec = records + ((long long)b * S + s) * 2 * RW + c0 + tx;
    rec[0] = h;
    rec[RW] = __float2half_rn(v - __half2float(h));
  }
}

int kf_conv_pack(const float* x, long long B, long long C, long long S, long long CIN_G, long long CP,
                 unsigned* amax, void* records, float* scale, cudaStream_t stream) {
  if (B == 0 || S == 0) return 0;
  cudaError_t err = cudaMemsetAsync(amax, 0, B * sizeof(unsigned), stream);
  if (err != cudaSuccess) return (int)err;
  const long long per_sample = C * S;
  const bool vec = per_sample % 4 == 0 && reinterpret_cast<size_t>(x) % 16 == 0;
  const long long chunks = (per_sample / (vec ? 4 : 1) + 2047) / 2048;  // 8 elements a thread at least
  const dim3 red((unsigned)(chunks < 1 ? 1 : chunks > 1024 ? 1024 : chunks), (unsigned)B);
  if (vec)
    kf_sample_amax_kernel<true><<<red, 256, 0, stream>>>(x, per_sample, amax);
  else
    kf_sample_amax_kernel<false><<<red, 256, 0, stream>>>(x, per_sample, amax);
  const long long RW = C / CIN_G * CP;
  const dim3 grid((unsigned)((S + 31) / 32), (unsigned)((RW + 31) / 32), (unsigned)B);
  kf_conv_pack_kernel<<<grid, 256, 0, stream>>>(x, (int)C, S, (int)CIN_G, (int)CP, (int)RW, amax,
                                                static_cast<__half*>(records), scale);
  return (int)cudaGetLastError();
}

// a 16-byte copy, or 16 zero bytes where !ok (cp.async reads no byte of a source of size 0)
__device__ __forceinline__ void kf_cp_async16_zfill(void* smem, const void* gmem, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(ok ? 16 : 0) : "memory");
#else
  *static_cast<int4*>(smem) = ok ? *static_cast<const int4*>(gmem) : make_int4(0, 0, 0, 0);
#endif
}

// The tile: KF_BM = 128 output pixels x BN = 32 WARPS_N output channels, 2 x WARPS_N warps of 64 x 32 (the GEMM's
// warp tile and kf_mma_stage), K blocks BK deep. WARPS_N = 4 (128 channels, 256 threads) or 2 (64 channels, 128
// threads: two blocks an SM; no half-empty tiles where C_out <= 64). BK = 64 halves the GEMM's block barriers and
// pipeline waits a product (32 where the GPU's shared memory is too small for it).
template <int WARPS_N, int BK_>
struct KfConvTile {
  static constexpr int BK = BK_, LDS = BK + 8;  // LDS: 16-byte aligned rows, 8 rows in 8 different bank quads
  static constexpr int BN = KF_WN * WARPS_N, THREADS = 32 * KF_WARPS_M * WARPS_N;
  static constexpr int A_PART = KF_BM * LDS, B_PART = BN * LDS;  // halves of one part in a stage
  static constexpr int STAGE = 2 * A_PART + 2 * B_PART;          // a hi, a lo, b hi, b lo
  static constexpr int A_CHUNKS = KF_BM * BK / 8 / THREADS;      // 16-byte copies a thread, a part
  static constexpr int B_CHUNKS = BN * BK / 8 / THREADS;
  static constexpr size_t EPI_BYTES = (size_t)KF_WARPS_M * WARPS_N * KF_WN * (KF_WM + 4) * sizeof(float);
  static constexpr size_t smem(int stages) {
    return (size_t)stages * STAGE * sizeof(__half) > EPI_BYTES ? (size_t)stages * STAGE * sizeof(__half) : EPI_BYTES;
  }
  static_assert(A_CHUNKS * THREADS * 8 == KF_BM * BK && B_CHUNKS * THREADS * 8 == BN * BK, "K block shape");
  static_assert(THREADS % (BK / 8) == 0, "a thread's copies keep their K offset in every chunk");
};

// One of a thread's tile rows (an output pixel), decoded once: its sample's first input pixel and its input corner
struct KfConvRow {
  long long base;  // b D H W
  int id0, ih0, iw0;
  bool ok;         // the row is an output pixel (< M)
};

__device__ __forceinline__ KfConvRow kf_conv_row(const KfConvArgs& a, long long m) {
  KfConvRow r;
  r.ok = m < a.M;
  m = r.ok ? m : 0;
  const long long P = (long long)a.OD * a.OH * a.OW;
  const long long b = m / P;
  const int p = (int)(m - b * P);
  const int ow = p % a.OW, oh = (p / a.OW) % a.OH, od = p / (a.OW * a.OH);
  r.base = b * a.D * a.H * a.W;
  r.id0 = od * a.SD - a.PD;
  r.ih0 = oh * a.SH - a.PH;
  r.iw0 = ow * a.SW - a.PW;
  return r;
}

// Where a launch's output pixel p (of its OD OH OW) lands in the FD FH FW output plane (32-bit: kf_conv_operands
// checks that a sample's output plane has fewer than 2^31 pixels)
__device__ __forceinline__ int kf_conv_out_pixel(const KfConvArgs& a, int p) {
  const int ow = p % a.OW, oh = p / a.OW % a.OH, od = p / (a.OW * a.OH);
  return ((a.RD + a.UD * od) * a.FH + a.RH + a.UH * oh) * a.FW + a.RW + a.UW * ow;
}

// K block kt into shared stage `st`. K runs over the taps, CP (a multiple of 8) channels each, so a thread's 8-wide
// piece k0 + kc is 8 channels of one tap (a block of 32 may span taps where CP < 32): the tap is decoded once a block
// (the piece's offset kc is the same in all of a thread's copies). Pieces past the last tap, in the padding or past
// M are zeros, and so are the weight's pieces past the last tap (past them lie the next phase's taps, or the row's
// end).
template <class T>
__device__ __forceinline__ void kf_conv_load_stage(__half* st, const KfConvArgs& a,
                                                   const KfConvRow (&rows)[T::A_CHUNKS], int group, int col0,
                                                   int kt) {
  const __half* x = static_cast<const __half*>(a.x);
  const __half* w = static_cast<const __half*>(a.w);
  const int kc = (threadIdx.x % (T::BK / 8)) * 8;
  const int k = kt * T::BK + kc;
  const int tap = k / a.CP, c = k - tap * a.CP;
  const bool in_k = tap < a.KD * a.KH * a.KW;
  const int kw = tap % a.KW, kh = (tap / a.KW) % a.KH, kd = tap / (a.KW * a.KH);
#pragma unroll
  for (int i = 0; i < T::A_CHUNKS; ++i) {
    const int r = (threadIdx.x + i * T::THREADS) / (T::BK / 8);
    const KfConvRow& row = rows[i];
    const int id = row.id0 + kd * a.DD, ih = row.ih0 + kh * a.DH, iw = row.iw0 + kw * a.DW;
    const bool ok = in_k && row.ok && (unsigned)id < (unsigned)a.D && (unsigned)ih < (unsigned)a.H &&
                    (unsigned)iw < (unsigned)a.W;
    const long long pix = ok ? row.base + ((long long)id * a.H + ih) * a.W + iw : 0;
    const int rw = a.G * a.CP;
    const __half* src = x + pix * 2 * rw + group * a.CP + c;
    const int s = r * T::LDS + kc;
    kf_cp_async16_zfill(st + s, src, ok);
    kf_cp_async16_zfill(st + T::A_PART + s, src + rw, ok);
  }
#pragma unroll
  for (int i = 0; i < T::B_CHUNKS; ++i) {
    const int r = (threadIdx.x + i * T::THREADS) / (T::BK / 8);
    const int last = (group + 1) * a.COUT_G - 1;  // the group's last channel: past it, never stored
    const long long gb = in_k ? (long long)min(col0 + r, last) * 2 * a.K2 + k : 0;
    const int s = 2 * T::A_PART + r * T::LDS + kc;
    kf_cp_async16_zfill(st + s, w + gb, in_k);
    kf_cp_async16_zfill(st + T::B_PART + s, w + gb + a.K2, in_k);
  }
}

template <int STAGES, int WARPS_N, int BK, class Epi>
__global__ void __launch_bounds__(KfConvTile<WARPS_N, BK>::THREADS) kf_conv_fp16x3p_kernel(KfConvArgs a, Epi epi) {
  using namespace nvcuda;
  using T = KfConvTile<WARPS_N, BK>;
  const int KT = (int)((a.K + BK - 1) / BK);
  constexpr int LD = KF_WM + 4;  // the epilogue's column-major warp tile: a multiple of 4 floats (wmma)
  extern __shared__ __align__(128) unsigned char kf_smem[];
  __half* smem = reinterpret_cast<__half*>(kf_smem);
  // column tiles fastest (a group's, then the next group's): the blocks in flight share their rows' records in L2
  const int tiles_g = (a.COUT_G + T::BN - 1) / T::BN, tiles_n = a.G * tiles_g;
  const long long row0 = (long long)(blockIdx.x / tiles_n) * KF_BM;
  const int group = (int)(blockIdx.x % tiles_n) / tiles_g;
  const int col0 = group * a.COUT_G + (int)(blockIdx.x % tiles_n % tiles_g) * T::BN;
  const int col_end = (group + 1) * a.COUT_G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;

  KfConvRow rows[T::A_CHUNKS];
#pragma unroll
  for (int i = 0; i < T::A_CHUNKS; ++i) rows[i] = kf_conv_row(a, row0 + (threadIdx.x + i * T::THREADS) / (BK / 8));

  KfAcc acc[KF_FM][KF_FN];
#pragma unroll
  for (int i = 0; i < KF_FM; ++i)
#pragma unroll
    for (int j = 0; j < KF_FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) kf_conv_load_stage<T>(smem + s * T::STAGE, a, rows, group, col0, s);
    kf_cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    kf_cp_async_wait<STAGES - 2>();  // K block kt has landed (this thread's copies) ...
    __syncthreads();                 // ... everyone's, and every warp is done with the stage refilled next
    const int next = kt + STAGES - 1;
    if (next < KT) kf_conv_load_stage<T>(smem + (next % STAGES) * T::STAGE, a, rows, group, col0, next);
    kf_cp_async_commit();
    const __half* st = smem + (kt % STAGES) * T::STAGE;
    kf_mma_stage<BK, T::LDS>(st, T::A_PART, st + 2 * T::A_PART, T::B_PART, wm, wn, acc);
  }
  kf_cp_async_wait<0>();
  __syncthreads();  // the ring is idle: its shared memory now stages each warp's tile

  float* tile = reinterpret_cast<float*>(kf_smem) + warp * (KF_WN * LD);  // [column][row]
#pragma unroll
  for (int i = 0; i < KF_FM; ++i)
#pragma unroll
    for (int j = 0; j < KF_FN; ++j)
      wmma::store_matrix_sync(tile + (j * 16) * LD + i * 16, acc[i][j], LD, wmma::mem_col_major);
  __syncwarp();
  const long long P = (long long)a.OD * a.OH * a.OW, PF = (long long)a.FD * a.FH * a.FW;
  const int n0 = col0 + wn * KF_WN;
#pragma unroll
  for (int h = 0; h < KF_WM / 32; ++h) {  // this lane's rows: lane, lane + 32
    const int r = lane + 32 * h;
    const long long m = row0 + wm * KF_WM + r;
    if (m >= a.M) break;
    const long long b = m / P;
    const long long base = b * a.N * PF + kf_conv_out_pixel(a, (int)(m - b * P));
    const float inv_a = kf_pow2_inv(a.x_scale[b]);
    for (int j = 0; j < KF_WN && n0 + j < col_end; ++j) {
      const int n = n0 + j;
      epi(epi.column(n), base, n, tile[j * LD + r] * inv_a * kf_pow2_inv(a.w_scale[n]));
    }
  }
}

template <int STAGES, int WARPS_N, int BK, class Epi>
cudaError_t kf_launch_conv(const KfConvArgs& a, const Epi& epi, cudaStream_t stream) {
  using T = KfConvTile<WARPS_N, BK>;
  auto kernel = kf_conv_fp16x3p_kernel<STAGES, WARPS_N, BK, Epi>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)T::smem(STAGES));
  if (err != cudaSuccess) return err;
  const long long tiles = ((a.M + KF_BM - 1) / KF_BM) * a.G * ((a.COUT_G + T::BN - 1) / T::BN);
  kernel<<<(unsigned)tiles, T::THREADS, T::smem(STAGES), stream>>>(a, epi);
  return cudaGetLastError();
}

// The convolution of `a` with epilogue `epi` on `stream`, by the shared memory a block may have (sm_90: 227 KiB,
// sm_80: 163): 64-channel tiles where C_out <= 64, two blocks an SM (K blocks of 32, 3 stages: 92 KiB; at 64 deep
// its rows' registers spill); else 128-channel tiles with K blocks of 64 and 3 stages (221 KiB) or 2 (147 KiB);
// else K blocks of 32, 2 stages (80 KiB).
template <class Epi>
int kf_conv(const KfConvArgs& a, const Epi& epi, cudaStream_t stream) {
  if (a.M == 0 || a.N == 0) return 0;
  int dev = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return (int)err;
  const size_t have = (size_t)optin;
  if (a.COUT_G <= 64 && have >= KfConvTile<2, 32>::smem(3)) return (int)kf_launch_conv<3, 2, 32>(a, epi, stream);
  if (have >= KfConvTile<4, 64>::smem(3)) return (int)kf_launch_conv<3, 4, 64>(a, epi, stream);
  if (have >= KfConvTile<4, 64>::smem(2)) return (int)kf_launch_conv<2, 4, 64>(a, epi, stream);
  return (int)kf_launch_conv<2, 4, 32>(a, epi, stream);
}
"""
