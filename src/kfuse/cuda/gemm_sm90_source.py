"""The Hopper GEMM of the CUDA backend: CUTLASS's warp-specialized TMA + wgmma kernel on the fp16x3p split.

Why CUTLASS: the WMMA tile of gemm_source.py (mma.sync-class instructions, one thread block a tile) ran seed 12
2.4-3.3x slower than the Triton backend's Gluon tile on an H100 (benchmarks/cuda_backend/NOTES.md); Hopper's
tensor cores reach their rate only through wgmma fed by the TMA unit, with a producer warp and mbarrier rings. That
machinery is what CUTLASS 3's sm90 collectives are, header-only (pip package nvidia-cutlass; `cutlass_include`
finds them), so the backend uses them rather than a hand-kept copy, and keeps its own arithmetic:

  operands   the split of gemm_source.py laid out three segments wide: x as [hi | hi | lo] and W as [hi | lo | hi]
             (rows of 3 CP fp16, CP = K padded to KF_PAD_K): one fp16 GEMM over K3 = 3 CP then sums exactly the
             three products hi*hi + hi*lo + lo*hi of the split (lo*lo is below fp32's last bit). The WMMA tile reads
             the same buffers (hi at segment 0, lo at segment 2 of x and 1 of W), so there is one operand format.
  mainloop   CUTLASS's sm90 "FP8" warp-specialized mainloop, instantiated on fp16: its only difference from the
             fp16 one is promotion, which is what the split needs: the tensor core truncates as it accumulates, so
             every few MMAs (kf_sm90_promote: 4 or 8 of 16 of K, chosen from an H100 sweep) the tensor-core partial
             is added into an fp32 register sum with a round-to-nearest FADD. With the segments a multiple of 64
             wide, most chunks hold one kind of product.
             Tile 128 x 128 x 64, two consumer warpgroups (cooperative) and a producer warp, clusters of 2 along M
             sharing W's tiles by TMA multicast, a persistent grid; as many stages as shared memory holds (7).
  epilogue   KfSm90Epilogue: each accumulator element, at its (m, n), has the row scales undone (exact powers of
             two) and goes through the region's epilogue functor (spellings.py), stores masked to m < M, n < N: the
             same functor the WMMA tile calls, so no second spelling of any op.

Built only where the GPU is sm_90 and the headers are there (runtime.cuda_flags adds -DKF_SM90, the include path
and the sm_90a target); everywhere else the translation unit holds the WMMA tile alone and kf_gemm never calls
this one.
"""

from __future__ import annotations

PROMOTE = 8  # MMAs (of 16 of K) between promotions at CP >= 2048: 128 of K (kf_sm90_promote says why)

GEMM_SM90 = r"""
#if defined(KF_SM90)
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
// the sm90 pieces only (collective_builder.hpp would pull in every architecture's builders: slower to build)
#include <cutlass/gemm/collective/collective_mma_decl.hpp>
#include <cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized.hpp>
#include <cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized_fp8.hpp>
#include <cutlass/gemm/collective/collective_builder_decl.hpp>
#include <cutlass/gemm/collective/builders/sm90_gmma_builder.inl>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/epilogue/collective/detail.hpp>

#ifndef KF_SM90_TILE_N
#define KF_SM90_TILE_N 128  // the tile's width (benchmarks/cuda_backend/sm90_variants.py builds others)
#endif
#ifndef KF_SM90_CLUSTER_N
#define KF_SM90_CLUSTER_N 1  // CTAs of a cluster along N, sharing x's tiles by multicast
#endif
#ifndef KF_SM90_MAX_PROMOTE
#define KF_SM90_MAX_PROMOTE PROMOTE_VALUE  // MMAs between promotions at the most (at large K)
#endif

// MMAs (16 of K each) between promotions, chosen from an H100 sweep (benchmarks/cuda_backend/NOTES.md, "The Hopper
// GEMM": errors against float64 over eager fp32's at 10 shapes, and problems/gemm at full size): below CP = 2048 the
// tensor core's truncation within a chunk dominates (a chunk of 16 MMAs is most of the sum: up to 4x eager's error at
// 37 x 70 -> 129), so every K block of 64 is promoted. From 2048 on, 8: the truncation leaves a bias in every output
// that grows with the chunk (problems/gemm/14 sums 4096 outputs: 2.0x eager's error at 16), while more promotions add
// fp32 roundings (4 gave 1.46x eager's error at 1024 x 2048 -> 1024, 8 1.48x) and time (seed 12: 4 +5%, 8 +1% over
// 16; 16384 x 4096 -> 4096: +13%, +5%).
inline unsigned kf_sm90_promote(long long k3) {
#ifdef KF_SM90_FIXED_PROMOTE
  return KF_SM90_FIXED_PROMOTE;  // benchmarks/cuda_backend/sm90_variants.py's sweep
#else
  return k3 >= 3 * 2048 ? KF_SM90_MAX_PROMOTE : 4;
#endif
}

// The epilogue collective (the interface of CUTLASS's DefaultEpilogue, wrapped below in its warp-specialized
// adapter): no shared memory, each thread's accumulators in place.
template <class Epi>
struct KfSm90Epilogue {
  using EpilogueSchedule = cutlass::epilogue::NoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  using ThreadEpilogueOp = Epi;  // named by CUTLASS's device adapter, never called through it
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using ElementOutput = float;
  using ElementC = void;
  using ElementD = float;
  using StrideC = cute::Stride<int64_t, cute::Int<1>, int64_t>;
  using StrideD = StrideC;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  struct SharedStorage {};
  using TensorStorage = SharedStorage;
  struct Arguments {
    Epi epi;
    const float* a_scale;
    const float* b_scale;
  };
  using Params = Arguments;

  template <class Problem>
  static constexpr Params to_underlying_arguments(Problem const&, Arguments const& args, void*) { return args; }
  template <class Problem>
  static size_t get_workspace_size(Problem const&, Arguments const&) { return 0; }
  template <class Problem>
  static cutlass::Status initialize_workspace(Problem const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class Problem>
  static bool can_implement(Problem const&, Arguments const&) { return true; }

  CUTLASS_HOST_DEVICE KfSm90Epilogue(Params const& p, SharedStorage const& = SharedStorage()) : params(p) {}
  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemMNKL, class BlockMNK, class CoordMNKL, class Engine, class Layout, class TiledMma,
            class Residue>
  CUTLASS_DEVICE void operator()(ProblemMNKL problem, BlockMNK blk, CoordMNKL coord,
                                 cute::Tensor<Engine, Layout> const& acc, TiledMma tiled_mma, Residue, int thread,
                                 char*) {
    using namespace cute;
    const int M = get<0>(problem), N = get<1>(problem);
    auto tile = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk),
                           make_coord(get<0>(coord), get<1>(coord)));
    auto where = tiled_mma.get_thread_slice(thread).partition_C(tile);  // (m, n) of each accumulator
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); ++i) {
      const int m = get<0>(where(i)), n = get<1>(where(i));
      if (m < M && n < N)
        params.epi(params.epi.column(n), m, n,
                   acc(i) * kf_pow2_inv(params.a_scale[m]) * kf_pow2_inv(params.b_scale[n]));
    }
  }

  Params params;
};

namespace kf_sm90 {
using Tile = cute::Shape<cute::_128, cute::Int<KF_SM90_TILE_N>, cute::_64>;
using Cluster = cute::Shape<cute::_2, cute::Int<KF_SM90_CLUSTER_N>, cute::_1>;
using Schedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
// the fp16 builder picks the wgmma atoms, shared-memory layouts and TMA copies; its stage count is kept
using Builder = cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::half_t, cutlass::layout::RowMajor, 8,
    cutlass::half_t, cutlass::layout::ColumnMajor, 8, float, Tile, Cluster,
    cutlass::gemm::collective::StageCountAutoCarveout<0>, Schedule>;
using Plain = typename Builder::CollectiveOp;
// ... and the promoting mainloop is run on them
using Mainloop = cutlass::gemm::collective::CollectiveMma<
    cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedFP8<Builder::PipelineStages, Cluster, Schedule>, Tile,
    cutlass::half_t, typename Plain::StrideA, cutlass::half_t, typename Plain::StrideB, typename Plain::TiledMma,
    typename Plain::GmemTiledCopyA, typename Plain::SmemLayoutAtomA, typename Plain::SmemCopyAtomA,
    typename Plain::TransformA, typename Plain::GmemTiledCopyB, typename Plain::SmemLayoutAtomB,
    typename Plain::SmemCopyAtomB, typename Plain::TransformB>;
template <class Epi>
using Kernel = cutlass::gemm::kernel::GemmUniversal<
    cute::Shape<int, int, int, int>, Mainloop,
    cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<KfSm90Epilogue<Epi>>>;
}  // namespace kf_sm90

// g.a, g.b: the three-segment rows (M, 3 g.K) and (N, 3 g.K), g.K = CP
template <class Epi>
cudaError_t kf_launch_sm90(const KfGemmArgs& g, const Epi& epi, cudaStream_t stream) {
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<kf_sm90::Kernel<Epi>>;
  const long long k3 = 3 * g.K;
  typename kf_sm90::Mainloop::StrideA sa = cute::make_stride((int64_t)k3, cute::Int<1>{}, (int64_t)0);
  typename kf_sm90::Mainloop::StrideB sb = cute::make_stride((int64_t)k3, cute::Int<1>{}, (int64_t)0);
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {(int)g.M, (int)g.N, (int)k3, 1},
                                {static_cast<const cutlass::half_t*>(g.a), sa,
                                 static_cast<const cutlass::half_t*>(g.b), sb, kf_sm90_promote(k3)},
                                {epi, g.a_scale, g.b_scale}};
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (Gemm::get_workspace_size(args) != 0) return cudaErrorInvalidValue;  // the persistent scheduler needs none
  if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return cudaErrorInvalidConfiguration;
  if (gemm.run(stream) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
  return cudaGetLastError();
}
#endif
""".replace("PROMOTE_VALUE", str(PROMOTE))
