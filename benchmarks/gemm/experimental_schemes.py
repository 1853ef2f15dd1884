"""GEMM schemes and options that no kfuse config uses, kept beside the scripts that measured them.

The shipped tile is src/kfuse/kernels/gemm_core.py (fp16x3p, tf32x3, ieee, fp64); benchmarks/gemm/NOTES.md has
the numbers ("Versions (H100)", "Bigger tiles for fp16x3p"). This module adds, on top of gemm_tile:
  "fp16x3"  FAST BUT NOT fp32-ACCURATE FOR LONG K: three single-dot K loops into ONE tensor-core accumulator
            (0.61 ms on problem 12).  The H100 tensor core truncates toward zero when it adds into its fp32
            accumulator; over K=8192 that gave 3.8e-5 max error (2.6x cuBLAS: fails the 2x rule), at K=4096 1.0e-5
            (1.7x: passes, barely).
  "fp16x3c" fp16x3 with the hi*hi loop promoted every PROMOTE_K (nested loop): accurate, but Triton spills and
            drains the pipeline at each promotion: 1.3-6 ms.
  "fp16x3d" three dots per K block into one accumulator (no promotion): 1.1e-4 max error (each K block adds the
            small terms into the big accumulator, 3x the truncations).
  tma=True  fp16x3p with TMA tile loads (device-side tensor descriptors, pre-split x): 209 -> 156 registers, no
            faster.  Tiles above gemm_core.HALVES_ABOVE load their two column halves as the first and second
            BLOCK_N/2 columns.
  persistent=True  one program per SM walking the tiles (the example kernel only; kfuse's generated kernels are
            persistent only as the Hopper twin): no faster.

`import experimental_schemes as gc` stands in for gemm_core in the measurement scripts (explore.py): the same
names, GemmConfig with promote_k and tma, SPLIT_SCHEMES and SCHEMES with these schemes, and gemm_bias_mul_leakyrelu
running any of them.

CPU check: TRITON_INTERPRET=1 python3 benchmarks/gemm/explore.py --cpu (tests/test_gemm_core.py runs them too).
"""
from __future__ import annotations

import dataclasses
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))

from kfuse.kernels import gemm_core as core  # noqa: E402
from kfuse.kernels.gemm_core import (  # noqa: E402,F401
    HALVES_ABOVE,
    LONG_K,
    PAD_K,
    SKINNY_M,
    _load_k_block,
    _num_sms,
    _pow2_inv,
    _tile_ids,
    _tile_row_scales,
    cdiv,
    default_config,
    ensure_tma_allocator,
    gemm_bias_mul_leakyrelu_ref,
    gemm_tile,
    padded_k,
    row_scales,
    skinny_configs,
    split_weight,
    split_x,
    valid_configs,
)

EXPERIMENTAL_SCHEMES = ("fp16x3", "fp16x3c", "fp16x3d")
SPLIT_SCHEMES = EXPERIMENTAL_SCHEMES + core.SPLIT_SCHEMES
SCHEMES = core.SCHEMES + EXPERIMENTAL_SCHEMES
RECOMMENDED_SCHEME = core.DEFAULT_SCHEME


@dataclasses.dataclass(frozen=True)
class GemmConfig(core.GemmConfig):
    promote_k: int = 1024  # "fp16x3c": K stretch per fresh tensor-core partial (multiple of block_k)
    tma: bool = False  # fp16x3p with split_a=False: TMA tile loads (tensor descriptors; see ensure_tma_allocator)

    def short(self) -> str:
        s = super().short()
        if self.promote_k != 1024:
            s += f"_pk{self.promote_k}"
        if self.tma:
            s += "_tma"
        return s


def tma_ok(*ts) -> bool:
    """TMA descriptors need unit last stride, 16-byte aligned bases and row strides (K % 8 == 0 for the split
    parts) and a CUDA device of compute capability >= 9."""
    for t in ts:
        if t.device.type != "cuda" or t.stride(-1) != 1 or (t.stride(0) * t.element_size()) % 16 or \
                t.data_ptr() % 16:
            return False
    return torch.cuda.get_device_capability(ts[0].device)[0] >= 9


@triton.jit
def _a_part(a, a_s, A_PART: tl.constexpr):
    """The A operand one of the fp16 dot loops multiplies: 0 = `a` as loaded (pre-split fp16 hi or lo); from fp32 x,
    1 = hi(x*s), 2 = lo(x*s) (s the row's power of two: exact)."""
    if A_PART == 1:
        a = (a * a_s[:, None]).to(tl.float16)
    elif A_PART == 2:
        av = a * a_s[:, None]
        a = (av - av.to(tl.float16).to(tl.float32)).to(tl.float16)
    return a


@triton.jit
def _fp16_dot_loop(acc, a_ptrs, b_ptrs, a_s, K, stride_ak, stride_bk,
                   BLOCK_K: tl.constexpr, A_PART: tl.constexpr, EVEN_K: tl.constexpr):
    """acc += sum over K of A_part @ B with ONE fp16 tensor-core dot per K block (Triton then keeps the wgmma
    asynchronous across iterations; several dots per iteration make it wait after each).
    A_PART: 0 = a_ptrs already point at fp16 (pre-split hi or lo); 1 = fp32 x, use hi(x*s); 2 = fp32 x, lo(x*s)."""
    offs_k = tl.arange(0, BLOCK_K)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        a, b = _load_k_block(a_ptrs, b_ptrs, offs_k, kb, K, BLOCK_K, EVEN_K)
        acc = tl.dot(_a_part(a, a_s, A_PART), b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _fp16_dot_loop_promoted(acc, a_ptrs, b_ptrs, a_s, K, stride_ak, stride_bk,
                            BLOCK_K: tl.constexpr, A_PART: tl.constexpr, EVEN_K: tl.constexpr,
                            PROMOTE_K: tl.constexpr):
    """Like _fp16_dot_loop, but the tensor cores accumulate each PROMOTE_K-long stretch of K into a fresh partial,
    which is then added to acc with a round-to-nearest fp32 FADD.  Why: the H100's tensor-core accumulation
    truncates every product to the accumulator's grid (measured: a single accumulator over K=8192 had 2.6x
    cuBLAS's error); restarting from 0 every PROMOTE_K keeps the partial small, so its truncation is tiny.
    Measured slow (nested loop: the pipeline drains at each promotion; two accumulators spill at 128x256)."""
    offs_k = tl.arange(0, BLOCK_K)
    for c0 in tl.range(0, K, PROMOTE_K, flatten=False):
        part = tl.zeros_like(acc)
        kc = tl.minimum(K - c0, PROMOTE_K)
        for kb in range(0, tl.cdiv(kc, BLOCK_K)):
            a, b = _load_k_block(a_ptrs, b_ptrs, offs_k, kb, kc, BLOCK_K, EVEN_K)
            part = tl.dot(_a_part(a, a_s, A_PART), b, part)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        acc += part
    return acc


@triton.jit
def _fp16x3p_tma(a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, pid_m, pid_n, M, N, K, stride_am, stride_bn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HALVES: tl.constexpr):
    """fp16x3p with TMA tile loads (device-side tensor descriptors; needs triton.set_allocator, see
    ensure_tma_allocator) on pre-split operands (SPLIT_A=False), unit K stride, 16-byte aligned rows and bases.
    Out-of-range rows/cols/K are zero-filled by the TMA unit (no masks, no address registers).
    HALVES: two column halves (first/second BLOCK_N/2 columns) with one shared partial, as _fp16x3p_halves."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    a_lo_desc = tl.make_tensor_descriptor(a_lo_ptr, shape=[M, K], strides=[stride_am, 1],
                                          block_shape=[BLOCK_M, BLOCK_K])
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    if HALVES:
        HALF: tl.constexpr = BLOCK_N // 2
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1], block_shape=[HALF, BLOCK_K])
        b_lo_desc = tl.make_tensor_descriptor(b_lo_ptr, shape=[N, K], strides=[stride_bn, 1],
                                              block_shape=[HALF, BLOCK_K])
        acc0 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            k = kb * BLOCK_K
            a_hi = a_desc.load([m0, k])
            a_lo = a_lo_desc.load([m0, k])
            b0 = b_desc.load([n0, k]).T
            b0_lo = b_lo_desc.load([n0, k]).T
            b1 = b_desc.load([n0 + HALF, k]).T
            b1_lo = b_lo_desc.load([n0 + HALF, k]).T
            part = tl.dot(a_lo, b0)
            part = tl.dot(a_hi, b0_lo, part)
            part = tl.dot(a_hi, b0, part)
            acc0 = acc0 + part
            part = tl.dot(a_lo, b1)
            part = tl.dot(a_hi, b1_lo, part)
            part = tl.dot(a_hi, b1, part)
            acc1 = acc1 + part
        acc = tl.reshape(tl.permute(tl.join(acc0, acc1), (0, 2, 1)), (BLOCK_M, BLOCK_N))
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
        b_lo_desc = tl.make_tensor_descriptor(b_lo_ptr, shape=[N, K], strides=[stride_bn, 1],
                                              block_shape=[BLOCK_N, BLOCK_K])
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            k = kb * BLOCK_K
            a_hi = a_desc.load([m0, k])
            a_lo = a_lo_desc.load([m0, k])
            b = b_desc.load([n0, k]).T
            b_lo = b_lo_desc.load([n0, k]).T
            part = tl.dot(a_lo, b)
            part = tl.dot(a_hi, b_lo, part)
            part = tl.dot(a_hi, b, part)
            acc = acc + part
    return acc


@triton.jit
def experimental_tile(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr,
                      pid_m, pid_n, M, N, K,
                      stride_am, stride_ak, stride_bn, stride_bk,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SCHEME: tl.constexpr, SPLIT_A: tl.constexpr, EVEN_K: tl.constexpr,
                      PROMOTE_K: tl.constexpr = 1024, USE_TMA: tl.constexpr = False, K_SLICES: tl.constexpr = 0):
    """gemm_tile's contract, with the schemes above: "fp16x3", "fp16x3c" (PROMOTE_K, a multiple of BLOCK_K: the K
    stretch its hi*hi loop sums in a fresh tensor-core partial), "fp16x3d", and fp16x3p with USE_TMA (SPLIT_A=False,
    unit K stride, 16-byte aligned rows; the launcher must have called ensure_tma_allocator()). Any other SCHEME
    runs gemm_tile itself."""
    if SCHEME == "fp16x3" or SCHEME == "fp16x3c" or SCHEME == "fp16x3d" or USE_TMA:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_am = offs_m % M
        offs_bn = offs_n % N
        offs_k = tl.arange(0, BLOCK_K)
        a_off = offs_am[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
        b_off = offs_bn[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if SPLIT_A == 2:
            a_s = _tile_row_scales(a_ptr, offs_am, K, stride_am, stride_ak, BLOCK_M, BLOCK_K)
        else:
            a_s = tl.load(a_scale_ptr + offs_am)
        if SCHEME == "fp16x3":
            # Three single-dot K loops into ONE tensor-core accumulator: lo*hi, hi*lo, then hi*hi.
            if SPLIT_A:
                acc = _fp16_dot_loop(acc, a_ptr + a_off, b_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                     BLOCK_K, 2, EVEN_K)
                acc = _fp16_dot_loop(acc, a_ptr + a_off, b_lo_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                     BLOCK_K, 1, EVEN_K)
                acc = _fp16_dot_loop(acc, a_ptr + a_off, b_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                     BLOCK_K, 1, EVEN_K)
            else:
                acc = _fp16_dot_loop(acc, a_lo_ptr + a_off, b_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                     BLOCK_K, 0, EVEN_K)
                acc = _fp16_dot_loop(acc, a_ptr + a_off, b_lo_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                     BLOCK_K, 0, EVEN_K)
                acc = _fp16_dot_loop(acc, a_ptr + a_off, b_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                     BLOCK_K, 0, EVEN_K)
        elif SCHEME == "fp16x3c":
            # The same three loops; the two small (lo) terms go first straight into acc (their truncation is
            # 2^-11 smaller), the big hi*hi term in PROMOTE_K stretches promoted with FADDs.
            if SPLIT_A:
                acc = _fp16_dot_loop(acc, a_ptr + a_off, b_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                     BLOCK_K, 2, EVEN_K)
                acc = _fp16_dot_loop(acc, a_ptr + a_off, b_lo_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                     BLOCK_K, 1, EVEN_K)
                acc = _fp16_dot_loop_promoted(acc, a_ptr + a_off, b_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                              BLOCK_K, 1, EVEN_K, PROMOTE_K)
            else:
                acc = _fp16_dot_loop(acc, a_lo_ptr + a_off, b_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                     BLOCK_K, 0, EVEN_K)
                acc = _fp16_dot_loop(acc, a_ptr + a_off, b_lo_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                     BLOCK_K, 0, EVEN_K)
                acc = _fp16_dot_loop_promoted(acc, a_ptr + a_off, b_ptr + b_off, a_s, K, stride_ak, stride_bk,
                                              BLOCK_K, 0, EVEN_K, PROMOTE_K)
        elif SCHEME == "fp16x3d":
            # one K loop, three dots per K block straight into acc (no fresh partial)
            a_ptrs = a_ptr + a_off
            a_lo_ptrs = a_lo_ptr + a_off
            b_ptrs = b_ptr + b_off
            b_lo_ptrs = b_lo_ptr + b_off
            for kb in range(0, tl.cdiv(K, BLOCK_K)):
                if EVEN_K:
                    a = tl.load(a_ptrs)
                    b = tl.load(b_ptrs)
                    b_lo = tl.load(b_lo_ptrs)
                else:
                    k_left = K - kb * BLOCK_K
                    a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
                    b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
                    b_lo = tl.load(b_lo_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
                if SPLIT_A:
                    av = a * a_s[:, None]  # exact (power of two)
                    a_hi = av.to(tl.float16)
                    a_lo = (av - a_hi.to(tl.float32)).to(tl.float16)
                else:
                    a_hi = a
                    if EVEN_K:
                        a_lo = tl.load(a_lo_ptrs)
                    else:
                        a_lo = tl.load(a_lo_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
                acc = tl.dot(a_lo, b, acc)
                acc = tl.dot(a_hi, b_lo, acc)
                acc = tl.dot(a_hi, b, acc)
                a_ptrs += BLOCK_K * stride_ak
                a_lo_ptrs += BLOCK_K * stride_ak
                b_ptrs += BLOCK_K * stride_bk
                b_lo_ptrs += BLOCK_K * stride_bk
        else:
            tl.static_assert(SCHEME == "fp16x3p" and not SPLIT_A, "USE_TMA: fp16x3p on pre-split x (SPLIT_A=False)")
            acc = _fp16x3p_tma(a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, pid_m, pid_n, M, N, K, stride_am, stride_bn,
                               BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_M * BLOCK_N > HALVES_ABOVE)
        b_s = tl.load(b_scale_ptr + offs_bn)  # undo the row/col powers of two (exact)
        acc = acc * _pow2_inv(a_s)[:, None] * _pow2_inv(b_s)[None, :]
    else:
        acc = gemm_tile(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, pid_m, pid_n, M, N, K,
                        stride_am, stride_ak, stride_bn, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, SPLIT_A,
                        EVEN_K, K_SLICES=K_SLICES)
    return acc


# ----------------------------------------------------------------------------------------------------------------
# the example kernel (KernelBench problem 12) on the experimental tile, persistent or not
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def _tile_bias_mul_leakyrelu(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, bias_ptr, out_ptr,
                             tile, M, N, K, stride_am, stride_ak, stride_bn, stride_bk, stride_om, stride_on,
                             mult, slope, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr, SCHEME: tl.constexpr, SPLIT_A: tl.constexpr,
                             EVEN_K: tl.constexpr, PROMOTE_K: tl.constexpr, USE_TMA: tl.constexpr = False,
                             K_SLICES: tl.constexpr = 0):
    pid_m, pid_n = _tile_ids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = experimental_tile(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr,
                            pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bn, stride_bk,
                            BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, SPLIT_A, EVEN_K, PROMOTE_K, USE_TMA=USE_TMA,
                            K_SLICES=K_SLICES)
    # epilogue on the fp32 accumulator, then a masked store
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
    y = (acc + bias[None, :]) * mult
    y = tl.where(y >= 0, y, y * slope)
    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, y, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def gemm_bias_mul_leakyrelu_kernel(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, bias_ptr, out_ptr,
                                   M, N, K, stride_am, stride_ak, stride_bn, stride_bk, stride_om, stride_on,
                                   mult, slope,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                   GROUP_M: tl.constexpr, SCHEME: tl.constexpr, SPLIT_A: tl.constexpr,
                                   EVEN_K: tl.constexpr, PERSISTENT: tl.constexpr, NUM_SMS: tl.constexpr,
                                   PROMOTE_K: tl.constexpr, USE_TMA: tl.constexpr = False,
                                   K_SLICES: tl.constexpr = 0):
    if PERSISTENT:  # one program per SM walks the tiles (grid = NUM_SMS)
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for tile in range(tl.program_id(0), num_tiles, NUM_SMS):
            _tile_bias_mul_leakyrelu(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, bias_ptr, out_ptr,
                                     tile, M, N, K, stride_am, stride_ak, stride_bn, stride_bk, stride_om, stride_on,
                                     mult, slope, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCHEME, SPLIT_A, EVEN_K,
                                     PROMOTE_K, USE_TMA, K_SLICES)
    else:  # one program per tile
        _tile_bias_mul_leakyrelu(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, bias_ptr, out_ptr,
                                 tl.program_id(0), M, N, K, stride_am, stride_ak, stride_bn, stride_bk,
                                 stride_om, stride_on, mult, slope, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCHEME,
                                 SPLIT_A, EVEN_K, PROMOTE_K, USE_TMA, K_SLICES)


def gemm_bias_mul_leakyrelu(x: torch.Tensor, w_parts, bias: torch.Tensor, mult: float, slope: float,
                            scheme: str = RECOMMENDED_SCHEME, config: core.GemmConfig | None = None,
                            x_parts: tuple | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """gemm_core.gemm_bias_mul_leakyrelu with any scheme of SCHEMES and the options of this module's GemmConfig
    (promote_k, tma, and persistent Triton kernels)."""
    assert scheme in SCHEMES, scheme
    M, K = x.shape
    if scheme in SPLIT_SCHEMES:
        w_hi, w_lo, w_scale = w_parts
        N = w_hi.shape[0]
        assert w_hi.dtype == torch.float16 and w_hi.stride() == w_lo.stride()
    else:
        w = w_parts[0] if isinstance(w_parts, (tuple, list)) else w_parts
        N = w.shape[0]
    cfg = config or default_config(M, N, K, scheme if scheme in core.SCHEMES else "fp16x3p")
    if out is None:
        out = torch.empty(M, N, device=x.device, dtype=torch.float32)
    if scheme in SPLIT_SCHEMES:
        if cfg.split_a == 2:
            a, a_lo, a_s = x, x, x  # the kernel computes the row scales
        elif cfg.split_a:
            x_scale = x_parts[2] if x_parts is not None else row_scales(x)
            a, a_lo, a_s = x, x, x_scale
        else:
            a, a_lo, a_s = x_parts if x_parts is not None else split_x(x)
        b, b_lo, b_s = w_hi, w_lo, w_scale
    else:
        a, a_lo, a_s = x, x, x
        b, b_lo, b_s = w, w, w
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    # both operands pre-split with zero-padded rows (split_x, split_weight): run K to the padding, unmasked
    padded = scheme in SPLIT_SCHEMES and not cfg.split_a and a.stride(0) == b.stride(0) == 2 * padded_k(K)
    k_run = padded_k(K) if padded else K
    if scheme == "fp64" and cfg.k_slices:
        assert x_parts is not None, "fp64 with k_slices: pass x_parts = skinny.fp64_partials(x, W, config)"
        part, strides = x_parts
        a = a_lo = a_s = b = b_lo = b_s = part
    assert b.stride() == b_lo.stride() and (cfg.split_a or a.stride() == a_lo.stride())
    use_tma = bool(getattr(cfg, "tma", False)) and scheme == "fp16x3p" and not cfg.split_a and tma_ok(a, a_lo, b, b_lo)
    if use_tma:
        ensure_tma_allocator()
    num_tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    nsm = _num_sms(x.device)
    grid = (min(num_tiles, nsm),) if cfg.persistent else (num_tiles,)
    gemm_bias_mul_leakyrelu_kernel[grid](
        a, a_lo, a_s, b, b_lo, b_s, bias, out, M, N, k_run, *strides, out.stride(0), out.stride(1),
        float(mult), float(slope),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        SCHEME=scheme, SPLIT_A=cfg.split_a, EVEN_K=(k_run % cfg.block_k == 0),
        PROMOTE_K=getattr(cfg, "promote_k", 1024), PERSISTENT=cfg.persistent, NUM_SMS=nsm if cfg.persistent else 1,
        USE_TMA=use_tma, K_SLICES=cfg.k_slices, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
