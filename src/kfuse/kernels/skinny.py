"""Skinny GEMMs (M <= SKINNY_M rows, e.g. a batch of 1) in float64: a GEMV-shaped split-K pass.

out = x @ W^T for x (M, K) and W (N, K) with M tiny is a read of W: 4 * N * K bytes, 2 * M * N * K flops
(problem 37: W 8192 x 8192 = 256 MiB -> 0.085 ms at ~3 TB/s; 0.13 GFLOP). The "fp64" scheme keeps the products
(exact: 24 + 24 bits < 53) and the sums in float64 and rounds once, so it is correctly rounded up to the
float64 sum error -- never less accurate than cuBLAS's fp32 GEMV.

Why a separate pass: a GEMM tile that walks all of K for its columns gives only N / BLOCK_N programs (256 at
N = 8192, 1 MiB of W each, read serially): too few bytes in flight to reach the memory bandwidth.  Here
`fp64_split_k_kernel` cuts K into S slices, so cdiv(N, BLOCK_N) * S programs each stream a
(BLOCK_N, K / S) block of W (K-contiguous: 16-byte vector loads) and keep a (BLOCK_M * BLOCK_N, BLOCK_K) float64
accumulator of elementwise FMAs (no cross-thread reduction inside the K loop; one at the end).  Each program
writes its (BLOCK_M, BLOCK_N) float64 partial sums to P (S, M, N); the region's own GEMM tile kernel then adds
the S slices in a fixed order (gemm_core.gemm_tile with K_SLICES = S: deterministic) in float64, rounds once
to fp32 and runs the region's epilogue as for any scheme.  P is S * M * N * 8 bytes (S = 4, M = 1, N = 8192:
256 KiB), written once and read once: negligible next to W.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.kernels.gemm_core import SKINNY_M, cdiv


@triton.jit
def fp64_split_k_kernel(x_ptr, w_ptr, p_ptr, M, N, K, K_SLICE, stride_xm, stride_xk, stride_wn, stride_wk,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """P[s, m, n] = sum over k in [s * K_SLICE, (s + 1) * K_SLICE) of x[m, k] * W[n, k], in float64.
    Grid (cdiv(N, BLOCK_N) * S, cdiv(M, BLOCK_M)), slice-major.  K_SLICE is a multiple of BLOCK_K, so only
    K's end can cut a block: EVEN_K (K % BLOCK_K == 0) drops the K mask, keeping the loads vectorized.
    The (row, column) pairs are flattened into BLOCK_M * BLOCK_N rows r = m * BLOCK_N + n of one 2-d
    (rows, BLOCK_K) tile, so x and W tiles load in the same K-contiguous layout and the float64 FMAs need no
    layout change or 3-d broadcast; at BLOCK_M = 1 (a batch of 1) the W loads are exactly W's block, and
    for BLOCK_M > 1 the repeated W rows (and every x row) come from L1.  At BLOCK_M = 1 x is one (BLOCK_K,)
    vector per K block, converted once and broadcast.
    Bytes from DRAM: W's (BLOCK_N, K_SLICE) block once; x (from L2); BLOCK_M * BLOCK_N * 8 written."""
    ROWS: tl.constexpr = BLOCK_M * BLOCK_N
    num_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    s = pid // num_n
    rows = tl.arange(0, ROWS)
    offs_m = tl.program_id(1) * BLOCK_M + rows // BLOCK_N
    offs_n = (pid % num_n) * BLOCK_N + rows % BLOCK_N
    offs_k = tl.arange(0, BLOCK_K)
    k0 = s * K_SLICE
    k_end = tl.minimum(K, k0 + K_SLICE)
    # rows past M / N wrap onto valid ones (loads need no row mask); they are never stored
    x_ptrs = x_ptr + (offs_m % M)[:, None].to(tl.int64) * stride_xm + (k0 + offs_k)[None, :] * stride_xk
    w_ptrs = w_ptr + (offs_n % N)[:, None].to(tl.int64) * stride_wn + (k0 + offs_k)[None, :] * stride_wk
    if BLOCK_M == 1:  # one x row: load (and convert) it once per K block, broadcast over the W rows
        x_ptrs = x_ptr + tl.program_id(1).to(tl.int64) * stride_xm + (k0 + offs_k) * stride_xk
    acc = tl.zeros((ROWS, BLOCK_K), dtype=tl.float64)
    for k in range(k0, k_end, BLOCK_K):
        in_k = (k + offs_k) < k_end
        if EVEN_K:
            xt = tl.load(x_ptrs)
            wt = tl.load(w_ptrs)
        elif BLOCK_M == 1:
            xt = tl.load(x_ptrs, mask=in_k, other=0.0)
            wt = tl.load(w_ptrs, mask=in_k[None, :], other=0.0)
        else:
            xt = tl.load(x_ptrs, mask=in_k[None, :], other=0.0)
            wt = tl.load(w_ptrs, mask=in_k[None, :], other=0.0)
        if BLOCK_M == 1:
            x64 = xt.to(tl.float64)[None, :]
        else:
            x64 = xt.to(tl.float64)
        acc += x64 * wt.to(tl.float64)  # exact products (24 + 24 bits), float64 sums
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    part = tl.sum(acc, axis=1)
    p_ptrs = p_ptr + s.to(tl.int64) * M * N + offs_m.to(tl.int64) * N + offs_n
    tl.store(p_ptrs, part, mask=(offs_m < M) & (offs_n < N))


def split_k_block_m(M: int) -> int:
    """The split pass's row tile: the power of two covering M (1 at a batch of 1: no padded row to multiply)."""
    return min(triton.next_power_of_2(max(M, 1)), SKINNY_M)


def k_slice_len(K: int, slices: int, block_k: int) -> int:
    """Length of each of the `slices` K slices: a multiple of block_k (slices past K come out as zeros)."""
    return cdiv(cdiv(max(K, 1), slices), block_k) * block_k


def fp64_partials(x: torch.Tensor, w: torch.Tensor, cfg) -> tuple:
    """x (M, K) and W (N, K) (any strides, fp32 or lower) -> (P, strides): P (S, M, N) float64 with S =
    cfg.k_slices partial sums over K, and the four strides gemm_tile takes to read it as its A operand with
    K_SLICES = S: (row stride, slice stride, column stride, unused 0).  Split tile: split_k_block_m(M) x
    cfg.split_block_n x cfg.block_k."""
    M, K = x.shape
    N = w.shape[0]
    S = cfg.k_slices
    part = torch.empty((S, M, N), device=x.device, dtype=torch.float64)
    bm = split_k_block_m(M)
    grid = (cdiv(N, cfg.split_block_n) * S, cdiv(M, bm))
    fp64_split_k_kernel[grid](x, w, part, M, N, K, k_slice_len(K, S, cfg.block_k), x.stride(0), x.stride(1),
                              w.stride(0), w.stride(1), BLOCK_M=bm, BLOCK_N=cfg.split_block_n,
                              BLOCK_K=cfg.block_k, EVEN_K=K % cfg.block_k == 0, num_warps=cfg.num_warps,
                              num_stages=cfg.num_stages)
    return part, (part.stride(1), part.stride(0), part.stride(2), 0)


def fp64_partials_ref(x: torch.Tensor, w: torch.Tensor, slices: int, block_k: int) -> torch.Tensor:
    """Plain torch reference of fp64_partials' P (S, M, N), in float64."""
    K = x.shape[1]
    ks = k_slice_len(K, slices, block_k)
    x64, w64 = x.double(), w.double()
    return torch.stack([x64[:, s * ks:(s + 1) * ks] @ w64[:, s * ks:(s + 1) * ks].t() for s in range(slices)])
