"""Long-K GEMMs (K >= gemm_core.LONG_K): K cut into slices, one fp32 tile product per slice, then the region's
tile adds the S partials in float64 in a fixed order (gemm_tile's K_SLICES) and runs its epilogue.

Two ways to the partials, P (S, M, N) fp32, slice s the product over its stretch of K:
  split_k_partials  pre-split operands (split_x, split_weight: fp16 hi/lo parts in memory), for a weight whose
                    split is cached (a Linear's) or an activation split once for many products;
  split_k_inputs    both operands fp32 as they lie (any strides: `x @ B` with B (K, N) is read without a
                    transposed copy), split into hi/lo inside the tile with per-row (A) and per-column (B) powers
                    of two; for bare products of two inputs, where every call would otherwise split both.
KernelBench level 1 problem 6 (256 x 256 x 524288) on an H100 (benchmarks/matmul/NOTES.md): the torch transposed
copy of B (512 MiB) that split_weight needs took 4.4 ms of the 6.0 ms; eager fp32 1.29 ms.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.kernels.gemm_core import GemmConfig, _pow2_inv, _pow2_scale_torch, _tile_ids, cdiv, gemm_tile, padded_k


def slice_len(kp: int, cfg: GemmConfig) -> tuple[int, int]:
    """(K_SLICE, S): each slice a multiple of block_k, about kp / cfg.k_slices long."""
    k_slice = cdiv(cdiv(kp, cfg.k_slices), cfg.block_k) * cfg.block_k
    return k_slice, cdiv(kp, k_slice)


@triton.jit
def split_k_partials_kernel(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, p_ptr, M, N, K, K_SLICE,
                            stride_am, stride_ak, stride_bn, stride_bk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SCHEME: tl.constexpr):
    """P[s] = the (M, N) product over K slice s = program_id(1) (pre-split operands, zero-padded K): one fp32
    accumulator per slice of K_SLICE (a multiple of BLOCK_K), so no tile sums more than K_SLICE of K itself."""
    s = tl.program_id(1).to(tl.int64)
    k0 = s * K_SLICE
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = gemm_tile(a_ptr + k0 * stride_ak, a_lo_ptr + k0 * stride_ak, a_scale_ptr, b_ptr + k0 * stride_bk,
                    b_lo_ptr + k0 * stride_bk, b_scale_ptr, pid_m, pid_n, M, N, tl.minimum(K_SLICE, K - k0),
                    stride_am, stride_ak, stride_bn, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, False, True)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(p_ptr + s * M * N + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc, mask=mask)


def split_k_partials(x_parts: tuple, w_parts: tuple, K: int, scheme: str, cfg: GemmConfig) -> tuple:
    """(P, strides) for a long-K GEMM: P (S, M, N) fp32, slice s the product over its stretch of the zero-padded
    K; the strides let gemm_tile read P as its A operand with K_SLICES = S (as skinny.fp64_partials' P)."""
    x_hi, x_lo, x_scale = x_parts
    w_hi, w_lo, w_scale = w_parts
    M, N, kp = x_hi.shape[0], w_hi.shape[0], padded_k(K)
    k_slice, slices = slice_len(kp, cfg)
    part = torch.empty((slices, M, N), device=x_hi.device, dtype=torch.float32)
    grid = (cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n), slices)
    split_k_partials_kernel[grid](x_hi, x_lo, x_scale, w_hi, w_lo, w_scale, part, M, N, kp, k_slice,
                                  x_hi.stride(0), x_hi.stride(1), w_hi.stride(0), w_hi.stride(1),
                                  BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                  GROUP_M=cfg.group_m, SCHEME=scheme, num_warps=cfg.num_warps,
                                  num_stages=cfg.num_stages)
    return part, (part.stride(1), part.stride(0), part.stride(2), 0)



@triton.jit
def split_k_inputs_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, p_ptr, M, N, K, K_SLICE,
                          stride_am, stride_ak, stride_bn, stride_bk, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """P[s] = the (M, N) product A @ B^T over K slice s = program_id(1), for fp32 A (M, K) and B (N, K) views
    (any strides), fp16x3p: each K block's A rows times a_scale and B rows times b_scale (powers of two: exact)
    are split into fp16 hi + lo here, three tensor-core products a_lo*b_hi + a_hi*b_lo + a_hi*b_hi into one fresh
    fp32 partial that is then added to the running sum (gemm_tile's fp16x3p order), unscaled at the end.
    The same parts, products and sums as split_k_partials on split_x / split_weight's parts; K is masked instead of
    zero-padded. Bytes: A and B read once (4 B/elem each), S * M * N * 4 written."""
    s = tl.program_id(1).to(tl.int64)
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    in_m, in_n = offs_m < M, offs_n < N
    a_s = tl.load(a_scale_ptr + offs_m, mask=in_m, other=1.0)
    b_s = tl.load(b_scale_ptr + offs_n, mask=in_n, other=1.0)
    k0 = s * K_SLICE
    k_end = tl.minimum(K, k0 + K_SLICE)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + (k0 + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + offs_n[None, :].to(tl.int64) * stride_bn + (k0 + offs_k)[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k0, k_end, BLOCK_K):
        in_k = (k + offs_k) < k_end
        a = tl.load(a_ptrs, mask=in_m[:, None] & in_k[None, :], other=0.0) * a_s[:, None]
        b = tl.load(b_ptrs, mask=in_k[:, None] & in_n[None, :], other=0.0) * b_s[None, :]
        a_hi = a.to(tl.float16)
        a_lo = (a - a_hi.to(tl.float32)).to(tl.float16)
        b_hi = b.to(tl.float16)
        b_lo = (b - b_hi.to(tl.float32)).to(tl.float16)
        part = tl.dot(a_lo, b_hi)
        part = tl.dot(a_hi, b_lo, part)
        part = tl.dot(a_hi, b_hi, part)
        acc = acc + part
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    acc = acc * _pow2_inv(a_s)[:, None] * _pow2_inv(b_s)[None, :]
    tl.store(p_ptr + s * M * N + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc,
             mask=in_m[:, None] & in_n[None, :])


def pow2_scales(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The power of two per row (dim=1) or column (dim=0) of t that split_x / split_weight use (_pow2_scale of
    the max |t| along `dim`'s other axis): one reduction over t, no copy of it."""
    amax = torch.linalg.vector_norm(t, float("inf"), dim=dim)
    return _pow2_scale_torch(amax.float())


def split_k_inputs(x2: torch.Tensor, b: torch.Tensor, cfg: GemmConfig) -> tuple:
    """(P, strides) as split_k_partials gives them, for x2 (M, K) and b (N, K) fp32 views (b = B.t() for x @ B),
    split inside the tile (split_k_inputs_kernel). Slices as split_k_partials' (of padded_k(K)), so the partials
    are the same sums."""
    M, K = x2.shape
    N = b.shape[0]
    k_slice, slices = slice_len(padded_k(K), cfg)
    part = torch.empty((slices, M, N), device=x2.device, dtype=torch.float32)
    grid = (cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n), slices)
    split_k_inputs_kernel[grid](x2, pow2_scales(x2, 1), b, pow2_scales(b, 1), part, M, N, K, k_slice,
                                x2.stride(0), x2.stride(1), b.stride(0), b.stride(1), BLOCK_M=cfg.block_m,
                                BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                                num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return part, (part.stride(1), part.stride(0), part.stride(2), 0)
