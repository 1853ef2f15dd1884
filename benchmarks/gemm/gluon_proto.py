"""Prototype: fp16x3 split GEMM in Gluon with asynchronous wgmma (Hopper). Compile-checked on the CPU for sm_90a."""
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from kfuse.kernels.gemm_sm90 import sm90_setup


@gluon.jit
def _issue_loads(a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, kb, n_k, off_m, off_n,
                 BLOCK_K: gl.constexpr, STAGES: gl.constexpr, pred=True):
    s = kb % STAGES
    pred = pred & (kb < n_k)
    bar = ready.index(s)
    nbytes: gl.constexpr = 2 * (a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    mbarrier.expect(bar, nbytes, pred=pred)
    k = kb * BLOCK_K
    tma.async_copy_global_to_shared(a_desc, [off_m, k], bar, a_hi_s.index(s), pred)
    tma.async_copy_global_to_shared(a_lo_desc, [off_m, k], bar, a_lo_s.index(s), pred)
    tma.async_copy_global_to_shared(b_desc, [off_n, k], bar, b_hi_s.index(s), pred)
    tma.async_copy_global_to_shared(b_lo_desc, [off_n, k], bar, b_lo_s.index(s), pred)


@gluon.jit
def _issue_mmas(a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, kb, part, use_acc, STAGES: gl.constexpr,
                A_REGS: gl.constexpr = False):
    """Wait for K block kb's operands, then issue its three products into `part` (asynchronously).
    A_REGS: A's parts go through registers (read from shared memory once, not once per product)."""
    s = kb % STAGES
    mbarrier.wait(ready.index(s), (kb // STAGES) & 1)
    b_hi = b_hi_s.index(s).permute((1, 0))
    b_lo = b_lo_s.index(s).permute((1, 0))
    if A_REGS:
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=part.type.layout, k_width=2)
        a_hi = a_hi_s.index(s).load(a_layout)
        a_lo = a_lo_s.index(s).load(a_layout)
    else:
        a_hi = a_hi_s.index(s)
        a_lo = a_lo_s.index(s)
    part = warpgroup_mma(a_lo, b_hi, part, use_acc=use_acc, is_async=True)
    part = warpgroup_mma(a_hi, b_lo, part, is_async=True)
    part = warpgroup_mma(a_hi, b_hi, part, is_async=True)
    return part


@gluon.jit
def fp16x3_gluon_tile(a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, off_m, off_n, M, N, K, stride_am, stride_bn,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                      CHUNK: gl.constexpr, OUT_LAYOUT: gl.constexpr, A_REGS: gl.constexpr = False):
    """acc (BLOCK_M, BLOCK_N) fp32 = sum_k (a_lo b_hi + a_hi b_lo + a_hi b_hi), K a multiple of BLOCK_K.
    CHUNK = 1: each K block's products go into a fresh tensor-core partial, added into acc one K block later
    (two partials in flight: the tensor cores never drain). CHUNK = c > 1: a partial sums c K blocks, then one
    drain and one add."""
    num_warps: gl.constexpr = gl.num_warps()
    # the descriptors, stages and barriers of kfuse's tile (this prototype made the same ones inline for
    # sm90/gluon-v1 and -v2; the empty barriers go unused here)
    (a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty) = sm90_setup(
        a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, M, N, K, stride_am, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    n_k = gl.cdiv(K, BLOCK_K)
    for i in gl.static_range(STAGES):
        _issue_loads(a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, i, n_k,
                     off_m, off_n, BLOCK_K, STAGES)
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_layout)
    if CHUNK == 1:
        # K blocks in pairs (an odd count gets one more block, all zeros: the TMA unit fills blocks past K with
        # zeros): p0 takes even blocks, p1 odd ones, each added into acc while the other one's products run.
        n_k = n_k + (n_k % 2)
        p0 = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_layout)
        p1 = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_layout)
        for kb in range(0, n_k, 2):
            t0 = _issue_mmas(a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, kb, p0, False, STAGES)
            t0, p1 = warpgroup_mma_wait(3, deps=(t0, p1))  # block kb - 1 done: p1 holds its products
            acc = acc + p1
            _issue_loads(a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready,
                         kb - 1 + STAGES, n_k, off_m, off_n, BLOCK_K, STAGES, kb > 0)
            t1 = _issue_mmas(a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, kb + 1, p1, False, STAGES)
            t1, p0 = warpgroup_mma_wait(3, deps=(t1, t0))  # block kb done
            acc = acc + p0
            _issue_loads(a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready,
                         kb + STAGES, n_k, off_m, off_n, BLOCK_K, STAGES, True)
            p1 = t1
        p1 = warpgroup_mma_wait(0, deps=(p1,))
        acc = acc + p1
    else:
        st = (a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty)
        acc = _chunked(st, n_k, off_m, off_n, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, CHUNK, A_REGS, False)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    return gl.convert_layout(acc, OUT_LAYOUT)


@gluon.jit
def _ws_loader(a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty, n_k, off_m, off_n,
               BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    """Producer warp: refill a stage as soon as the consumers release it."""
    for kb in range(n_k):
        s = kb % STAGES
        mbarrier.wait(empty.index(s), ((kb // STAGES) & 1) ^ 1)
        bar = ready.index(s)
        mbarrier.expect(bar, 2 * (a_desc.block_type.nbytes + b_desc.block_type.nbytes))
        k = kb * BLOCK_K
        tma.async_copy_global_to_shared(a_desc, [off_m, k], bar, a_hi_s.index(s))
        tma.async_copy_global_to_shared(a_lo_desc, [off_m, k], bar, a_lo_s.index(s))
        tma.async_copy_global_to_shared(b_desc, [off_n, k], bar, b_hi_s.index(s))
        tma.async_copy_global_to_shared(b_lo_desc, [off_n, k], bar, b_lo_s.index(s))


@gluon.jit
def _ws_release(empty, kb, STAGES: gl.constexpr):
    gl.thread_barrier()  # both warpgroups are past their wait: the stage's wgmma reads are done
    mbarrier.arrive(empty.index(kb % STAGES))


@gluon.jit
def _block_done(st, i, n_k, off_m, off_n, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr):
    """K block i's products are done: its stage is free (WS: tell the producer warp; else load block i + STAGES)."""
    a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty = st
    if WS:
        _ws_release(empty, i, STAGES)
    else:
        _issue_loads(a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, i + STAGES, n_k,
                     off_m, off_n, BLOCK_K, STAGES, True)


@gluon.jit
def _chunked(st, n_k, off_m, off_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
             STAGES: gl.constexpr, CHUNK: gl.constexpr, A_REGS: gl.constexpr, WS: gl.constexpr):
    """Chunks of CHUNK K blocks: the partial runs on the tensor cores through a chunk (one wait per block keeps a
    block's products in flight while the next block's are issued), then one drain and a round-to-nearest add.
    ptxas serializes every wgmma when registers of an unfinished pipeline stage are read, so the add must follow
    a wait(0), and the loop nest keeps the in-flight partial out of the add's path."""
    a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty = st
    num_warps: gl.constexpr = gl.num_warps()
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_layout)
    part = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_layout)
    for c0 in range(0, n_k, CHUNK):
        c_end = min(c0 + CHUNK, n_k)
        t = _issue_mmas(a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, c0, part, False, STAGES, A_REGS)
        part = warpgroup_mma_wait(3, deps=(t,))
        for kb in range(c0 + 1, c_end):
            t = _issue_mmas(a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, kb, part, True, STAGES, A_REGS)
            part = warpgroup_mma_wait(3, deps=(t,))  # block kb - 1 done: its stage is free
            _block_done(st, kb - 1, n_k, off_m, off_n, BLOCK_K, STAGES, WS)
        part = warpgroup_mma_wait(0, deps=(part,))
        _block_done(st, c_end - 1, n_k, off_m, off_n, BLOCK_K, STAGES, WS)
        acc = acc + part
    return acc


@gluon.jit
def _ws_mma(st, n_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
            CHUNK: gl.constexpr, A_REGS: gl.constexpr):
    return (_chunked(st, n_k, 0, 0, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, CHUNK, A_REGS, True),)


@gluon.jit
def fp16x3_gluon_tile_ws(a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, off_m, off_n, M, N, K, stride_am, stride_bn,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                         CHUNK: gl.constexpr, OUT_LAYOUT: gl.constexpr, A_REGS: gl.constexpr = False):
    """fp16x3_gluon_tile (chunked) with a producer warp issuing the TMA loads (warp specialization)."""
    (a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty) = sm90_setup(
        a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, M, N, K, stride_am, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
    n_k = gl.cdiv(K, BLOCK_K)
    acc = gl.warp_specialize([
        (_ws_mma, ((a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty), n_k,
                   BLOCK_M, BLOCK_N, BLOCK_K, STAGES, CHUNK, A_REGS)),
        (_ws_loader, (a_desc, a_lo_desc, b_desc, b_lo_desc, a_hi_s, a_lo_s, b_hi_s, b_lo_s, ready, empty, n_k,
                      off_m, off_n, BLOCK_K, STAGES)),
    ], [1], [24])
    return gl.convert_layout(acc[0], OUT_LAYOUT)  # outside the partitions: the stages' memory is free again


@triton.jit
def _epilogue_store(acc, out_ptr, bias_ptr, pid_m, pid_n, M, N, mult, slope,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Plain Triton epilogue code, as the generated region kernels write it (AutoLayout in Gluon)."""
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N)
    bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
    y = (acc + bias[None, :]) * mult
    y = tl.where(y >= 0, y, y * slope)
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], y,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@gluon.jit
def bias_mul_leakyrelu_kernel(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, bias_ptr, out_ptr,
                              M, N, K, stride_am, stride_bn, mult, slope,
                              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                              STAGES: gl.constexpr, CHUNK: gl.constexpr, GROUP_M: gl.constexpr,
                              WS: gl.constexpr = False, A_REGS: gl.constexpr = False):
    num_warps: gl.constexpr = gl.num_warps()
    out_layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [num_warps, 1], [1, 0])
    tile = gl.program_id(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_in_group = GROUP_M * num_pid_n
    first_m = (tile // num_in_group) * GROUP_M
    group_size = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % num_in_group) % group_size
    pid_n = (tile % num_in_group) // group_size
    if WS:
        acc = fp16x3_gluon_tile_ws(a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, K,
                                   stride_am, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, CHUNK, out_layout, A_REGS)
    else:
        acc = fp16x3_gluon_tile(a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, K,
                                stride_am, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, CHUNK, out_layout, A_REGS)
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N)
    a_s = tl.load(a_scale_ptr + offs_m % M)
    b_s = tl.load(b_scale_ptr + offs_n % N)
    acc = acc / a_s[:, None] / b_s[None, :]
    _epilogue_store(acc, out_ptr, bias_ptr, pid_m, pid_n, M, N, mult, slope, BLOCK_M, BLOCK_N)


def compile_for_sm90(kernel, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=3, CHUNK=1, num_warps=8, WS=False,
                     maxnreg=None, A_REGS=False):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = {"a_ptr": "*fp16", "a_lo_ptr": "*fp16", "a_scale_ptr": "*fp32", "b_ptr": "*fp16", "b_lo_ptr": "*fp16",
           "b_scale_ptr": "*fp32", "bias_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
           "stride_am": "i32", "stride_bn": "i32", "mult": "fp32", "slope": "fp32",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "STAGES": "constexpr",
           "CHUNK": "constexpr", "GROUP_M": "constexpr", "WS": "constexpr",
           "A_REGS": "constexpr"}
    consts = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "STAGES": STAGES, "CHUNK": CHUNK,
              "GROUP_M": 8, "WS": WS, "A_REGS": A_REGS}
    src = GluonASTSource(kernel, sig, constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "maxnreg": maxnreg})


if __name__ == "__main__":
    import os
    import subprocess
    import tempfile
    for cfg in [dict(CHUNK=8), dict(CHUNK=8, WS=True, maxnreg=168)]:  # (BLOCK_N=192: not a power of two)
        k = compile_for_sm90(bias_mul_leakyrelu_kernel, **cfg)
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(k.asm["cubin"])
        cuobj = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
        usage = subprocess.run([cuobj, "--dump-resource-usage", f.name], capture_output=True, text=True)
        print(cfg, usage.stdout.strip().splitlines()[-1])
