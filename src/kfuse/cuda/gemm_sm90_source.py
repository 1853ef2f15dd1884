"""The Hopper GEMM of the CUDA backend: CUTLASS's warp-specialized TMA + wgmma machinery on the fp16x3p split.

Why CUTLASS: the WMMA tile of gemm_source.py (mma.sync-class instructions, one thread block a tile) ran seed 12
2.4-3.3x slower than the Triton backend's Gluon tile on an H100 (benchmarks/cuda_backend/NOTES.md); Hopper's
tensor cores reach their rate only through wgmma fed by the TMA unit, with a producer warp and mbarrier rings. That
machinery is what CUTLASS 3's sm90 kernels and collectives are, header-only (pip package nvidia-cutlass;
runtime.cutlass_include finds them), so the backend builds on them rather than on a hand-kept copy, and keeps its
own arithmetic:

  operands   the split of gemm_source.py: rows [hi | lo] of 2 CP fp16 (CP = K padded to KF_PAD_K), the format
             the WMMA tile reads too.
  mainloop   SplitMainloop, the Gluon tile's arrangement (kfuse/kernels/gemm_sm90.py): each pipeline stage holds
             a 64-deep K block of x's hi and lo and W's hi and lo (four 16 KiB tiles; TMA reads the rows as
             (rows, CP, 2), hi at 0, lo at 1); the consumers issue hi*hi into `part`, promoted into the fp32
             register sum every kf_sm90_promote K blocks with a round-to-nearest FADD (the tensor core truncates as
             it accumulates), and lo*hi + hi*lo into `cross` over all of K (2^-11 of the result: its truncation
             costs nothing). The promotion waits for hi*hi alone while the cross products run on. 3 stages (64 KiB
             each); tiles 128 x 128 x 64, two consumer warpgroups (cooperative) and a producer warp, clusters of 2
             along M sharing W's tiles by TMA multicast, a persistent grid. It replaced one fp16 GEMM over a
             concatenated K ([hi|hi|lo] . [hi|lo|hi] on CUTLASS's promoting mainloop: 6 tiles for 3 products, 22%
             slower and up to 2.8x eager's error; benchmarks/cuda_backend/NOTES.md).
  epilogue   KfSm90Epilogue: each accumulator element, at its (m, n), has the row scales undone (exact powers of
             two) and goes through the region's epilogue functor (spellings.py), stores masked to m < M, n < N: the
             same functor the WMMA tile calls, so no second spelling of any op.

Built only where the GPU is sm_90 and the headers are there (runtime.build_options adds -DKF_SM90, the include path
and the sm_90a target); everywhere else the translation unit holds the WMMA tile alone and kf_gemm never calls
this one.
"""

from __future__ import annotations

PROMOTE = 2  # K blocks (of 64) of hi*hi between promotions at CP >= 2048 (kf_sm90_promote says why)

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
#ifndef KF_SM90_SPLIT_STAGES
#define KF_SM90_SPLIT_STAGES 3  // 64 KiB a stage
#endif
#ifndef KF_SM90_MAX_PROMOTE
#define KF_SM90_MAX_PROMOTE PROMOTE_VALUE  // K blocks between promotions at the most (at large K)
#endif

// K blocks of hi*hi (64 of K each) between promotions, from H100 sweeps (benchmarks/cuda_backend/NOTES.md, "The
// Hopper GEMM": errors against float64 over eager fp32's at 10 shapes, and every problems/gemm file at full size):
// below CP = 2048 a chunk is most of the sum and its truncation shows, so every K block is promoted; from 2048 on,
// every 2 (fewer fp32 additions, and the fastest measured: seed 12 0.624 ms against 0.668 at every block and 0.696
// at every 4). Problem 14 (a sum of 4096 outputs, where the truncation's bias adds up) needs it short: an earlier
// mainloop missed rule 3 there at 4 blocks.
inline unsigned kf_sm90_promote(long long cp) {
#ifdef KF_SM90_FIXED_PROMOTE
  return KF_SM90_FIXED_PROMOTE;  // benchmarks/cuda_backend/sm90_variants.py's sweep
#else
  return cp >= 2048 ? KF_SM90_MAX_PROMOTE : 1;
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

// The Gluon tile's arrangement (kfuse/kernels/gemm_sm90.py) on CUTLASS's machinery: each pipeline stage holds a K
// block of x's hi and lo and of W's hi and lo (four 16 KiB tiles, two of the base collective's slots each for x and
// W), loaded by two TMA copies per operand from the rows [hi | lo] viewed as (rows, CP, 2), hi at l = 0 and lo at
// l = 1; the consumers issue hi*hi into `part` (promoted into the fp32 sum every
// `interval` K blocks: the wait is for that batch only, wgmma batches retiring in order, while the cross products
// run on) and lo*hi + hi*lo into `cross` (2^-11 of the result: its truncation costs nothing; added at the end).
// 4 tiles for 3 products (a concatenated K loads 6).
constexpr int SplitStages = KF_SM90_SPLIT_STAGES;
using SplitBase = cutlass::gemm::collective::CollectiveMma<
    cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedFP8<2 * SplitStages, Cluster, Schedule>, Tile,
    cutlass::half_t, typename Plain::StrideA, cutlass::half_t, typename Plain::StrideB, typename Plain::TiledMma,
    typename Plain::GmemTiledCopyA, typename Plain::SmemLayoutAtomA, typename Plain::SmemCopyAtomA,
    typename Plain::TransformA, typename Plain::GmemTiledCopyB, typename Plain::SmemLayoutAtomB,
    typename Plain::SmemCopyAtomB, typename Plain::TransformB>;

struct SplitMainloop : SplitBase {
  using Base = SplitBase;
  using MainloopPipeline = cutlass::PipelineTmaAsync<SplitStages>;
  using PipelineState = cutlass::PipelineState<SplitStages>;
  using PipelineParams = typename MainloopPipeline::Params;
  using TensorStorage = typename Base::TensorStorage;  // 2 SplitStages slots: hi in 2 s, lo in 2 s + 1
  struct SharedStorage {
    TensorStorage tensors;
    using PipelineStorage = typename MainloopPipeline::SharedStorage;
    PipelineStorage pipeline;
  };
  using PipelineStorage = typename SharedStorage::PipelineStorage;
  using Arguments = typename Base::Arguments;  // dA, dB: (row, 1, offset of lo); interval in K blocks
  using Params = typename Base::Params;
  static constexpr int K_PIPE_MAX = SplitStages;

  template <class Problem>
  static Params to_underlying_arguments(Problem const& problem, Arguments const& args, void*) {
    using namespace cute;
    auto [M, N, K, L] = append<4>(problem, 1);
    Tensor a = make_tensor(args.ptr_A, make_layout(make_shape(M, K, 2), args.dA));
    Tensor b = make_tensor(args.ptr_B, make_layout(make_shape(N, K, 2), args.dB));
    auto tma_a = make_tma_copy_A_sm90(typename Base::GmemTiledCopyA{}, a, typename Base::SmemLayoutA{}(_, _, Int<0>{}),
                                      Tile{}, Cluster{});
    auto tma_b = make_tma_copy_B_sm90(typename Base::GmemTiledCopyB{}, b, typename Base::SmemLayoutB{}(_, _, Int<0>{}),
                                      Tile{}, Cluster{});
    return {tma_a, tma_b, 2 * Base::TmaTransactionBytes, 2 * Base::TmaTransactionBytesMK,
            2 * Base::TmaTransactionBytesNK, args.mma_promotion_interval};
  }

  template <class Problem>
  static bool can_implement(Problem const& problem, Arguments const& args) {
    return Base::can_implement(problem, Arguments{args.ptr_A, args.dA, args.ptr_B, args.dB, 4}) &&
           args.mma_promotion_interval >= 1;
  }

  template <class ProblemMNKL>
  CUTLASS_DEVICE auto load_init(ProblemMNKL const& problem, Params const& params) const {
    using namespace cute;
    auto [M, N, K, L] = problem;
    Tensor ma = params.tma_load_a.get_tma_tensor(make_shape(M, K, 2));
    Tensor mb = params.tma_load_b.get_tma_tensor(make_shape(N, K, 2));
    return cute::make_tuple(local_tile(ma, Tile{}, make_coord(_, _, _), Step<_1, Underscore, _1>{}),
                            local_tile(mb, Tile{}, make_coord(_, _, _), Step<Underscore, _1, _1>{}));
  }

  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState write,
                           cute::tuple<TensorA, TensorB> const& inputs, BlockCoord const& blk, KTileIterator k_iter,
                           int k_tiles, int, uint32_t block_rank_in_cluster, TensorStorage& smem) {
    using namespace cute;
    if (!cute::elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(smem.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(smem.smem_B.data()), typename Base::SmemLayoutB{});
    constexpr uint32_t cluster_x = get<0>(Cluster{});
    const uint2 id = {block_rank_in_cluster % cluster_x, block_rank_in_cluster / cluster_x};
    auto tma_a = params.tma_load_a.get_slice(id.y);
    auto tma_b = params.tma_load_b.get_slice(id.x);
    auto [m, n, k, l] = blk;
    Tensor gA = get<0>(inputs)(_, _, m, _, _);  // (BLK_M, BLK_K, k, part)
    Tensor gB = get<1>(inputs)(_, _, n, _, _);
    Tensor tAgA = tma_a.partition_S(gA);
    Tensor tAsA = tma_a.partition_D(sA);
    Tensor tBgB = tma_b.partition_S(gB);
    Tensor tBsB = tma_b.partition_D(sB);
    uint16_t mask_a = 0, mask_b = 0;
    auto blocks = Layout<Cluster>{};
    if constexpr (cute::is_same_v<typename Base::GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>)
      for (int j = 0; j < size<1>(blocks); ++j) mask_a |= uint16_t(1) << blocks(id.x, j, Int<0>{});
    if constexpr (cute::is_same_v<typename Base::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>)
      for (int i = 0; i < size<0>(blocks); ++i) mask_b |= uint16_t(1) << blocks(i, id.y, Int<0>{});
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tiles > 0; --k_tiles) {
      pipeline.producer_acquire(write);
      auto* bar = pipeline.producer_get_barrier(write);
      const int s = write.index();
      CUTLASS_PRAGMA_UNROLL
      for (int part = 0; part < 2; ++part) {
        copy(params.tma_load_a.with(*bar, mask_a), tAgA(_, _, _, *k_iter, part), tAsA(_, _, _, 2 * s + part));
        copy(params.tma_load_b.with(*bar, mask_b), tBgB(_, _, _, *k_iter, part), tBsB(_, _, _, 2 * s + part));
      }
      ++k_iter;
      ++write;
    }
  }

  CUTLASS_DEVICE void load_tail(MainloopPipeline pipeline, PipelineState write) {
    if (cute::elect_one_sync()) pipeline.producer_tail(write);
  }

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& acc, int k_tiles, int thread,
                          TensorStorage& smem, Params const& params) {
    using namespace cute;
    using TiledMma = typename Base::TiledMma;
    Tensor sA = make_tensor(make_smem_ptr(smem.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(smem.smem_B.data()), typename Base::SmemLayoutB{});
    constexpr int groups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    auto group_layout = make_layout(Int<groups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int group = __shfl_sync(0xFFFFFFFF, thread / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thr = tiled_mma.get_slice(group_layout(group));
    Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, MMA_M, MMA_K, slot)
    Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
    Tensor part = make_fragment_like(acc);
    Tensor cross = make_fragment_like(acc);
    clear(acc);
    const int interval = (int)params.mma_promotion_interval;
    PipelineState release = read;
    int count = 0;
    bool fresh_part = true, fresh_cross = true;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int t = 0; t < k_tiles; ++t) {
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      const int hi = 2 * read.index(), lo = hi + 1;
      warpgroup_arrive();
      tiled_mma.accumulate_ = fresh_part ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, hi), tCrB(_, _, kb, hi), part);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      tiled_mma.accumulate_ = fresh_cross ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, lo), tCrB(_, _, kb, hi), cross);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        cute::gemm(tiled_mma, tCrA(_, _, kb, hi), tCrB(_, _, kb, lo), cross);
      }
      warpgroup_commit_batch();
      fresh_cross = false;
      // this block's hi*hi is done (batches retire in order; its cross products run on), and with it every batch of
      // the previous block, whose stage goes back to the producer. One wait for both: ptxas serializes every wgmma
      // of the loop (C7514) where the read of `part` follows a wait it cannot match to part's batch.
      warpgroup_wait<1>();
      if (t > 0) {
        pipeline.consumer_release(release);
        ++release;
      }
      fresh_part = ++count == interval;
      if (fresh_part) {
        warpgroup_fence_operand(part);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(acc); ++i) acc(i) += part(i);
        count = 0;
      }
      ++read;
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(part);
    warpgroup_fence_operand(cross);
    if (count > 0) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc); ++i) acc(i) += part(i);
    }
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); ++i) acc(i) += cross(i);
  }

  // the last stage's release (mma releases all others)
  CUTLASS_DEVICE void mma_tail(MainloopPipeline pipeline, PipelineState release, int k_tiles) {
    if (k_tiles <= 0) return;
    release.advance(k_tiles - 1);
    cute::warpgroup_wait<0>();
    pipeline.consumer_release(release);
  }
};

template <class Epi>
using Kernel = cutlass::gemm::kernel::GemmUniversal<
    cute::Shape<int, int, int, int>, SplitMainloop,
    cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<KfSm90Epilogue<Epi>>>;
}  // namespace kf_sm90

// g.a, g.b: the rows [hi | lo] of x (M, 2 g.K) and W (N, 2 g.K), g.K = CP
template <class Epi>
cudaError_t kf_launch_sm90(const KfGemmArgs& g, const Epi& epi, cudaStream_t stream) {
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<kf_sm90::Kernel<Epi>>;
  const long long k = g.K;  // (rows, CP, part): hi at part 0, lo at part 1 (CP further on)
  typename kf_sm90::SplitMainloop::StrideA sa = cute::make_stride((int64_t)(2 * k), cute::Int<1>{}, (int64_t)k);
  typename kf_sm90::SplitMainloop::StrideB sb = cute::make_stride((int64_t)(2 * k), cute::Int<1>{}, (int64_t)k);
  const unsigned interval = kf_sm90_promote(k);
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {(int)g.M, (int)g.N, (int)k, 1},
                                {static_cast<const cutlass::half_t*>(g.a), sa,
                                 static_cast<const cutlass::half_t*>(g.b), sb, interval},
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
