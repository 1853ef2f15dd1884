"""The fp16x3p GEMM tile for Hopper (sm_90) in Gluon: asynchronous wgmma, TMA loads, a producer warp.

Why a second implementation of gemm_core's "fp16x3p" tile: Triton 3.6 waits for every tl.dot to finish
(`warp_group_dot_wait pendings=0` after each), so the three products of each K block drained the tensor cores
three times per block, and the fresh partial per block needs a second fp32 accumulator, which kept the tile at
128 x 128: 0.69 ms for problem 12's GEMM, 3.1-3.3 ms for 16384 x 4096 -> 4096 (benchmarks/gemm/NOTES.md).
Gluon (triton.experimental.gluon, shipped with Triton >= 3.5) issues wgmma asynchronously and waits where we say.

The same arithmetic as gemm_core's fp16x3p (pre-split, row-scaled fp16 hi/lo parts; lo*lo dropped), arranged so
that the tensor cores wait only at the end of a chunk of K blocks:
  * `cross` sums lo*hi + hi*lo over ALL of K in one tensor-core accumulator. Its terms are 2^-11 of the result, so
    the tensor core's truncating accumulation costs 2^-11 of what it would cost the main term: nothing.
  * `part` sums hi*hi over a CHUNK of K blocks (4 x 64 = 256 of K), then is added into the fp32 register sum `acc`
    with a round-to-nearest FADD ("promotion"). Each block issues hi*hi first, so the promotion waits for that
    product only (wgmma groups retire in order) while the block's two cross products keep the tensor cores busy:
    3-4% off the forward of every seed against a full drain (interleaved A/B: benchmarks/gemm/NOTES.md, "Early
    promotion wait, tail split, a fair tuner"). ptxas serializes every wgmma of a loop if registers of an
    unfinished wgmma are read (C7514), so a promotion cannot come earlier.
    The chunk is bounded by accuracy, not speed: the tensor core truncates toward zero, so a longer chunk leaves a
    bias in every output that a column mean does not average away: at 8 blocks problem 39's BatchNorm
    running_mean missed rule 3 (1.43e-7 against a bound of 1.42e-7); at 4 it passes. Measured on the H100, the
    GEMM kernel took about the same time at chunks of 4, 8 and 16 (benchmarks/gemm/NOTES.md, "The fp16x3p tile
    in Gluon").
  * three accumulators of a 128 x 128 tile over 8 warps are 192 registers a thread: a producer warp (24 registers,
    setmaxnreg) issues the TMA loads, so the 8 consumer warps get 240.
  * STAGES shared-memory stages of hi and lo for A and B (64 KB each at 128 x 128 x 64: 3 stages), refilled as
    soon as both warpgroups have finished a block (an mbarrier per stage each way).
  * one tile per block (gemm_tile_sm90: the epilogue runs after the warp-specialized region, where the stages'
    memory is free for a layout change), or persistent (regions/sm90_twin.py: a block per SM walks its tiles with
    sm90_tile_mma and the generated epilogue, while sm90_loader already loads the next tile). Where the last wave
    would be a few tiles (runtime.sm90_tail), the blocks cut those along K instead, and the block that finishes a
    tile's last slice sums the slices and runs its epilogue (sm90_tail_piece, sm90_tail_done, sm90_tail_sum):
    problem 39's 4096 tiles on 132 SMs take 31 tile-times plus an eighth instead of 32 (-1.2% of its forward).

Operands (as gemm_tile with SPLIT_A=False): a_ptr / a_lo_ptr = x_hi / x_lo (M, K) fp16 and b_ptr / b_lo_ptr =
w_hi / w_lo (N, K) fp16, rows zero-padded to a multiple of 64 (padded_k) with 16-byte aligned row strides (the
split tensors are); a_scale_ptr / b_scale_ptr = the rows' powers of two. The TMA unit zero-fills rows past M
and N. Tensor descriptors are made on the device (needs triton.set_allocator: gemm_core.ensure_tma_allocator).
The result is the (BLOCK_M, BLOCK_N) fp32 tile in a blocked layout; the generated kernel's epilogue, written with
triton.language, takes its layouts from it (Gluon's automatic layouts; regions/common.py makes the twin).
"""
from __future__ import annotations

import triton.language as tl

from kfuse.kernels.gemm_core import _pow2_inv, _tile_ids

try:  # Gluon ships with Triton >= 3.5; without it every GEMM runs the Triton kernels
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton
    gluon = gl = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = None
    HAVE_GLUON = False


def sm90_jit(fn):
    """gluon.jit where Gluon exists (the function is only compiled when an sm_90 config is launched)."""
    return gluon.jit(fn) if HAVE_GLUON else fn


@sm90_jit
def sm90_setup(a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, M, N, K, stride_am, stride_bn, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """One block's TMA descriptors, shared-memory stages and mbarriers, shared by the loader and the consumers."""
    a_sl: tl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float16)
    b_sl: tl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], gl.float16)
    a_desc = tma.make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [BLOCK_M, BLOCK_K], a_sl)
    a_lo_desc = tma.make_tensor_descriptor(a_lo_ptr, [M, K], [stride_am, 1], [BLOCK_M, BLOCK_K], a_sl)
    b_desc = tma.make_tensor_descriptor(b_ptr, [N, K], [stride_bn, 1], [BLOCK_N, BLOCK_K], b_sl)
    b_lo_desc = tma.make_tensor_descriptor(b_lo_ptr, [N, K], [stride_bn, 1], [BLOCK_N, BLOCK_K], b_sl)
    a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty = sm90_buffers(BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
    return (a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty)


@sm90_jit
def sm90_buffers(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """(a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty): STAGES shared-memory stages of the four operand blocks and
    their mbarriers (a stage is ready once loaded, empty once consumed)."""
    a_sl: tl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float16)
    b_sl: tl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], gl.float16)
    a_hi_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_M, BLOCK_K], a_sl)
    a_lo_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_M, BLOCK_K], a_sl)
    b_hi_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, BLOCK_K], b_sl)
    b_lo_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, BLOCK_K], b_sl)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty


@sm90_jit
def sm90_full_tiles(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr):
    """The tiles a persistent grid's blocks walk whole: all of them, or with TAIL the full waves only (the rest,
    fewer tiles than blocks, is split along K over the blocks: sm90_tail_piece)."""
    tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    if TAIL:
        tiles -= tiles % gl.num_programs(0)
    return tiles


@sm90_jit
def sm90_tail_piece(M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, tail_split):
    """This block's piece of the tail (the last, partial wave of tiles): each tail tile's K blocks are cut into
    tail_split slices, block p taking slice p // tail of tile p % tail. Returns (tile, slot: the tile's index
    within the tail, the slice, its K blocks kb0 .. kb1 - 1); blocks past tail * tail_split get an empty range."""
    tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    tail = tiles % gl.num_programs(0)
    slot = gl.program_id(0) % tail
    j = gl.program_id(0) // tail
    n_k = gl.cdiv(K, BLOCK_K)
    kb0 = min(j, tail_split) * n_k // tail_split
    kb1 = min(j + 1, tail_split) * n_k // tail_split
    return tiles - tail + slot, slot, j, kb0, kb1


@sm90_jit
def _sm90_load_tile(st, tile, kb0, kb1, i, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr):
    """K blocks kb0 .. kb1 - 1 of `tile`, the i-th (of the block's sequence) into stage i % STAGES once the
    consumers have released it. Returns the next i."""
    a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty = st
    pid_m, pid_n = _tile_ids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    for kb in range(kb0, kb1):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes the first wait
        bar = ready.index(s)
        mbarrier.expect(bar, 2 * (a_desc.block_type.nbytes + b_desc.block_type.nbytes))
        k = kb * BLOCK_K
        tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, k], bar, a_hi_s.index(s))
        tma.async_copy_global_to_shared(a_lo_desc, [pid_m * BLOCK_M, k], bar, a_lo_s.index(s))
        tma.async_copy_global_to_shared(b_desc, [pid_n * BLOCK_N, k], bar, b_hi_s.index(s))
        tma.async_copy_global_to_shared(b_lo_desc, [pid_n * BLOCK_N, k], bar, b_lo_s.index(s))
        i += 1
    return i


@sm90_jit
def sm90_loader(st, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, STAGES: tl.constexpr, TAIL: tl.constexpr, tail_split):
    """Producer warp: every K block of this block's tiles (tiles program_id, + num_programs, ...: one tile unless the
    grid is persistent; with TAIL, then its piece of the tail), in the consumers' order. It runs ahead across
    tile boundaries, so a persistent block's next tile is loading while its consumers run the epilogue."""
    n_k = gl.cdiv(K, BLOCK_K)
    i = 0
    for tile in range(gl.program_id(0), sm90_full_tiles(M, N, BLOCK_M, BLOCK_N, TAIL), gl.num_programs(0)):
        i = _sm90_load_tile(st, tile, 0, n_k, i, M, N, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES)
    if TAIL:
        tile, slot, j, kb0, kb1 = sm90_tail_piece(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, tail_split)
        _sm90_load_tile(st, tile, kb0, kb1, i, M, N, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES)


@sm90_jit
def _sm90_products(a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, i, cross, part, FRESH: tl.constexpr,
                   STAGES: tl.constexpr):
    """Wait for the i-th K block, then issue its products asynchronously: hi*hi into `part` (FRESH: from zero, a
    new chunk), then lo*hi and hi*lo into `cross`."""
    s = i % STAGES
    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
    b_hi = b_hi_s.index(s).permute((1, 0))
    b_lo = b_lo_s.index(s).permute((1, 0))
    part = warpgroup_mma(a_hi_s.index(s), b_hi, part, use_acc=not FRESH, is_async=True)
    cross = warpgroup_mma(a_lo_s.index(s), b_hi, cross, is_async=True)
    cross = warpgroup_mma(a_hi_s.index(s), b_lo, cross, is_async=True)
    return cross, part


@sm90_jit
def _sm90_release(empty, i, STAGES: tl.constexpr):
    """Both warpgroups are past their wait for the i-th block: its stage may be refilled (one thread arrives)."""
    gl.thread_barrier()
    mbarrier.arrive(empty.index(i % STAGES))


@sm90_jit
def sm90_tile_mma(st, i0, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
                  CHUNK: tl.constexpr):
    """The consumer warps' K loop of one tile, K blocks i0 .. i0 + n_k - 1 of the block's stage sequence, in
    chunks (module docstring): acc + cross, unscaled, in the wgmma accumulator layout. Each block issues hi*hi
    first, so a chunk's promotion waits for that product only while the block's two cross products run on; their
    stage is released once the next block's products are issued."""
    a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty = st
    num_warps: tl.constexpr = gl.num_warps()
    mma: tl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    part = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    cross = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    for c0 in range(i0, i0 + n_k, CHUNK):
        c_end = min(c0 + CHUNK, i0 + n_k)
        cross, part = _sm90_products(a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, c0, cross, part, True, STAGES)
        cross, part = warpgroup_mma_wait(3, deps=(cross, part))  # the previous chunk's last block is done
        if c0 > i0:
            _sm90_release(empty, c0 - 1, STAGES)
        for i in range(c0 + 1, c_end):
            cross, part = _sm90_products(a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, i, cross, part, False, STAGES)
            cross, part = warpgroup_mma_wait(3, deps=(cross, part))  # block i - 1 is done
            _sm90_release(empty, i - 1, STAGES)
        part = warpgroup_mma_wait(2, deps=(part,))  # the chunk's last hi*hi is done: part may be read
        acc = acc + part
    cross = warpgroup_mma_wait(0, deps=(cross,))
    _sm90_release(empty, i0 + n_k - 1, STAGES)
    return acc + cross


@sm90_jit
def sm90_scaled(acc, a_scale_ptr, b_scale_ptr, pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc with the rows' and columns' powers of two undone (exact), in acc's layout."""
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc.type.layout))
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc.type.layout))
    a_s = gl.load(a_scale_ptr + offs_m % M)
    b_s = gl.load(b_scale_ptr + offs_n % N)
    return acc * _pow2_inv(a_s)[:, None] * _pow2_inv(b_s)[None, :]


@sm90_jit
def _sm90_tail_slices(acc, slot, tail_ws, tail_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pointers, in acc's layout, to slice 0 of tail tile `slot` in the workspace tail_ws (tail x tail_split
    row-major (BLOCK_M, BLOCK_N) fp32 tiles); slice j is BLOCK_M * BLOCK_N further."""
    layout: tl.constexpr = acc.type.layout
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    return tail_ws + slot * tail_split * (BLOCK_M * BLOCK_N) + rows[:, None] * BLOCK_N + cols[None, :]


@sm90_jit
def sm90_tail_done(acc, slot, j, tail_ws, tail_cnt, tail_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store this block's partial (unscaled, as sm90_tile_mma returns it) of tail tile `slot`, slice j, into the
    workspace tail_ws and count it in tail_cnt[slot] (zeroed by the launcher).
    True in the block that counted the tile's last slice: it then sums them (sm90_tail_sum) and runs the
    epilogue. The stores are released at GPU scope by the count (after a barrier of the consumer warps), the
    count is acquired by the summing block: CUTLASS's split-K semaphore, in Gluon."""
    ptrs = _sm90_tail_slices(acc, slot, tail_ws, tail_split, BLOCK_M, BLOCK_N)
    gl.store(ptrs + j * (BLOCK_M * BLOCK_N), acc)
    gl.thread_barrier()
    return gl.atomic_add(tail_cnt + slot, 1, sem="acq_rel", scope="gpu") == tail_split - 1


@sm90_jit
def sm90_tail_sum(acc, slot, tail_ws, tail_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Tail tile `slot`'s slices summed in slice order (the same sum whichever block runs it), in acc's layout.
    Read from L2 (.cg): the other blocks wrote them."""
    ptrs = _sm90_tail_slices(acc, slot, tail_ws, tail_split, BLOCK_M, BLOCK_N)
    total = gl.load(ptrs, cache_modifier=".cg")
    for j in range(1, tail_split):
        total += gl.load(ptrs + j * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
    return total


@sm90_jit
def _sm90_one_tile(st, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
                   CHUNK: tl.constexpr):
    return (sm90_tile_mma(st, 0, n_k, BLOCK_M, BLOCK_N, STAGES, CHUNK),)


@gluon.constexpr_function if HAVE_GLUON else (lambda f: f)
def _out_layout(BLOCK_M, BLOCK_N, num_warps):
    """Rows of 4-wide (16-byte) column vectors, a warp across min(BLOCK_N, 128) columns."""
    cols = min(32, BLOCK_N // 4)
    return gl.BlockedLayout([1, 4], [32 // cols, cols], [num_warps, 1], [1, 0])


@sm90_jit
def gemm_tile_sm90(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, pid_m, pid_n, M, N, K,
                   stride_am, stride_ak, stride_bn, stride_bk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, SCHEME: tl.constexpr, SPLIT_A: tl.constexpr, EVEN_K: tl.constexpr,
                   GROUP_M: tl.constexpr = 8, STAGES: tl.constexpr = 3, CHUNK: tl.constexpr = 4):
    """gemm_tile's contract (fp16x3p, SPLIT_A=False, K a multiple of BLOCK_K, unit K strides) on sm_90, one tile per
    block: the fp32 (BLOCK_M, BLOCK_N) tile of x @ W^T at (pid_m, pid_n) (the block's, by _tile_ids and GROUP_M),
    scales undone, in a blocked layout. Rows/cols past M/N hold zeros."""
    tl.static_assert(SCHEME == "fp16x3p" and not SPLIT_A and EVEN_K, "the sm_90 tile takes pre-split operands")
    num_warps: tl.constexpr = gl.num_warps()
    st = sm90_setup(a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, M, N, K, stride_am, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K,
                    STAGES)
    res = gl.warp_specialize([
        (_sm90_one_tile, (st, gl.cdiv(K, BLOCK_K), BLOCK_M, BLOCK_N, STAGES, CHUNK)),
        (sm90_loader, (st, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES, False, 1)),
    ], [1], [24])
    # outside the partitions, so the stages' shared memory is free for the layout change
    acc = gl.convert_layout(res[0], _out_layout(BLOCK_M, BLOCK_N, num_warps))
    return sm90_scaled(acc, a_scale_ptr, b_scale_ptr, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)
