"""fp32-accurate GEMM tiles on tensor cores (plain Triton + torch; meant to be pasted into generated files).

out = x @ W^T with x (M, K) fp32 and W (N, K) fp32 (nn.Linear layout), accurate to fp32 (max abs error vs a
float64 evaluation within ~2x of cuBLAS fp32's own error) but computed on the fp16 tensor cores.

Why the split works
-------------------
fp16 keeps 11 significant bits, fp32 24.  Write every operand value v as v = hi + lo with hi = fp16(v) and
lo = fp16(v - hi): hi + lo carries ~22 bits, so the three products hi*hi + hi*lo + lo*hi (lo*lo is below fp32's
last bit and is dropped) reproduce an fp32 product to ~2^-22 relative.  Tensor-core products of fp16 values are
exact and are summed in fp32, so the only other error is the fp32 accumulation, as in cuBLAS.

fp16 has a narrow range (max 65504, normal down to 2^-14), so every ROW of x and every row of W (= output
column) is first multiplied by a power of two s chosen from the data: s = 2^(14 - floor(log2(max|row|))), so the
row's largest magnitude lands in [2^14, 2^15).  Powers of two are exact, so the scaling adds no error; it is undone
on the fp32 accumulator (acc * (1/s_row) * (1/s_col), again exact).  With max|row| at 2^14, hi is normal for
values down to 2^-28 of the row max and lo (|lo| <= 2^-11 |hi|) stays normal for values down to 2^-17 of the
row max; below that the lost bits sit under 2^-38 of the row max, far under fp32's rounding of the sum.  No
separate "lo scale" is needed (the products hi*lo are exact in fp32 either way), so all three products can share
one tensor-core accumulator.  Scaled values are < 2^15, so the accumulator is bounded by K * 2^30: it cannot
overflow whatever the input's range (1e-6 or 1e6 inputs work the same).

Schemes (SCHEME constexpr of gemm_tile); H100 numbers from benchmarks/gemm/NOTES.md
-------------------------------------------------------------------------------------
  "fp16x3p" the default on a GPU.  The fp16 split above, one K loop with three dots per K block, each block's
            three products summed in a FRESH tensor-core partial that is then added into the fp32 register
            accumulator with a round-to-nearest FADD ("promotion": the H100's tensor core truncates when it
            accumulates, so a partial that never grows keeps its truncation tiny).  Max error 2e-6 (cuBLAS fp32:
            1.45e-5).  0.68-0.73 ms GEMM on problem 12 (128x128x64 tiles: the partial + sum need two
            accumulators).  Tiles above HALVES_ABOVE elements (e.g. 128x256, where an epilogue needs wide column
            tiles) run as two column halves sharing one partial (fits, but slower: Triton waits after every dot).
  "tf32x3"  Triton's built-in 3-pass tf32 split (fp32 operands, tensor cores at the tf32 rate, half fp16's).
            Accurate; 1.7 ms on problem 12.
  "ieee"    plain fp32 FMA dot (input_precision="ieee").  Slow (no tensor cores); the reference scheme, and the one
            that runs under the CPU interpreter.
  "fp64"    skinny GEMMs (M <= SKINNY_M): products and sums in float64 on the CUDA cores (kernels/skinny.py).
The schemes measured and not shipped (fp16x3, fp16x3c, fp16x3d, TMA tile loads, persistent Triton kernels) live
in benchmarks/gemm/experimental_schemes.py, beside the scripts that measured them.  Which scheme a GEMM runs is
decided in one place (runtime.scheme_for), which configs a kernel can run in another (supports, below).

x's split: SPLIT_A=True loads fp32 x tiles and splits them in registers inside the GEMM (needs only the per-row
scales, from split_rows_kernel with WRITE_PARTS=False: one read of x); SPLIT_A=2 computes those scales in the GEMM
too; SPLIT_A=False takes x pre-split into fp16 hi/lo by split_rows_kernel (one read of x, one write of 2 bytes +
2 bytes per element).

Cost (problem 12: M=1024, K=8192, N=8192):  3 x 2*M*N*K = 412 GFLOP of fp16 tensor-core work -> 0.51 ms at the
803 TFLOP/s measured for bf16 cuBLAS on the H100; bytes: W hi+lo 2*128 MiB + x 32 MiB + out 32 MiB = 320 MiB ->
0.11 ms at 2.9 TB/s, so the kernel is compute bound.  (Problem 39 shape: M=16384, K=N=4096: 1.65 TFLOP -> 2.05 ms.)
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl


def _patch_interpreter_for_numpy24() -> None:
    """Triton 3.6's CPU interpreter turns every scalar into a 1-element array and calls int() on it for
    `range(0, K)`; numpy >= 2.4 refuses int() of a 1-d array ("only 0-dimensional arrays can be converted").
    Re-register __index__ to read the single element.  Only interpreted kernels go through it."""
    try:
        import triton.runtime.interpreter as interp
    except Exception:  # pragma: no cover
        return
    if getattr(interp, "_kfuse_numpy24_patch", False) or not hasattr(interp, "_patch_lang_tensor"):
        return
    orig = interp._patch_lang_tensor

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched
    interp._kfuse_numpy24_patch = True


_patch_interpreter_for_numpy24()

# The split scheme scales every row so that its max |value| lands in [2^TARGET_EXP, 2^(TARGET_EXP+1)).
TARGET_EXP = 14
DEFAULT_SCHEME = "fp16x3p"
USER_SCHEMES = (DEFAULT_SCHEME, "tf32x3", "ieee")  # what `kfuse optimize --scheme` takes
SPLIT_SCHEMES = ("fp16x3p",)  # the schemes whose operands are fp16 hi/lo parts (split_weight, split_x)
# "fp64": x and W read as fp32, products and sums in float64 on the CUDA cores, rounded once. For skinny GEMMs
# (M <= SKINNY_M rows: a batch of 1) the GEMM is a memory-bound read of W, the tensor-core tiles waste all
# but M of their rows, and the split scheme's ~3e-7 relative error is above cuBLAS's GEMV error (rule 3 failed
# at batch 1, problems/gemm/37 on an H100); float64 sums cost nothing there and are correctly rounded.
SKINNY_M = 16
SCHEMES = USER_SCHEMES + ("fp64",)
# fp16x3p tiles of more elements than this run as two column halves (_fp16x3p_halves): two full fp32 accumulators
# of a 128 x 256 tile would take all 65536 registers of the SM
HALVES_ABOVE: tl.constexpr = tl.constexpr(128 * 128)


# ----------------------------------------------------------------------------------------------------------------
# per-row power-of-two scales and the fp16 hi/lo split
# ----------------------------------------------------------------------------------------------------------------
def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch grids, in plain Python: Triton 3.6's triton.cdiv is a constexpr function whose
    host-side call costs ~10 us, several per forward, which small (launch-bound) problems feel."""
    return -(-a // b)


@triton.jit
def _pow2_scale(amax):
    """Power of two s with amax * s in [2^14, 2^15): built from amax's exponent bits, so it is exact."""
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased exponent of amax
    field = 127 + 14 + 127 - e  # biased exponent of s = 2^(14 - (e - 127))
    field = tl.minimum(tl.maximum(field, 2), 252)  # zero/subnormal/inf rows: clamp (s and 1/s stay normal)
    return (field << 23).to(tl.float32, bitcast=True)


def _pow2_scale_torch(amax: torch.Tensor) -> torch.Tensor:
    """_pow2_scale on a float32 tensor, in torch: the same bits."""
    e = (amax.contiguous().view(torch.int32) >> 23) & 0xFF
    return (((127 + 14 + 127 - e).clamp(2, 252)) << 23).to(torch.int32).view(torch.float32)


@triton.jit
def _pow2_inv(s):
    """1/s for a power of two s made by _pow2_scale (exact, no division)."""
    e = (s.to(tl.int32, bitcast=True) >> 23) & 0xFF
    return ((254 - e) << 23).to(tl.float32, bitcast=True)


@triton.jit
def split_rows_kernel(x_ptr, parts_ptr, scale_ptr, C, CP, stride_xr, stride_xc,
                      BLOCK_C: tl.constexpr, WRITE_PARTS: tl.constexpr):
    """One program per row r: s[r] = _pow2_scale(max |x[r, :]|); if WRITE_PARTS, hi = fp16(x*s), lo = fp16(x*s - hi)
    into the contiguous (R, 2*CP) fp16 tensor parts = [hi | lo], each CP = padded_k(C) wide, zeros past C.
    Reads the row once when CP <= BLOCK_C (the launcher makes it so for CP <= 16384), else twice (second pass
    mostly from L2)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_C)
    xrow = x_ptr + row * stride_xr
    prow = parts_ptr + row * 2 * CP
    if CP <= BLOCK_C:
        v = tl.load(xrow + offs * stride_xc, mask=offs < C, other=0.0)
        s = _pow2_scale(tl.max(tl.abs(v), axis=0))
        tl.store(scale_ptr + row, s)
        if WRITE_PARTS:
            vs = v * s
            hi = vs.to(tl.float16)
            lo = (vs - hi.to(tl.float32)).to(tl.float16)
            tl.store(prow + offs, hi, mask=offs < CP)
            tl.store(prow + CP + offs, lo, mask=offs < CP)
    else:
        m = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            v = tl.load(xrow + (c0 + offs) * stride_xc, mask=c0 + offs < C, other=0.0)
            m = tl.maximum(m, tl.abs(v))
        s = _pow2_scale(tl.max(m, axis=0))
        tl.store(scale_ptr + row, s)
        if WRITE_PARTS:
            for c0 in range(0, CP, BLOCK_C):
                v = tl.load(xrow + (c0 + offs) * stride_xc, mask=c0 + offs < C, other=0.0)
                vs = v * s
                hi = vs.to(tl.float16)
                lo = (vs - hi.to(tl.float32)).to(tl.float16)
                tl.store(prow + c0 + offs, hi, mask=c0 + offs < CP)
                tl.store(prow + CP + c0 + offs, lo, mask=c0 + offs < CP)


@triton.jit
def split_chunks_kernel(x_ptr, parts_ptr, scale_ptr, cmax_ptr, C, CP, NCHUNK, stride_xr, stride_xc,
                        BLOCK_C: tl.constexpr, NCHUNK_P2: tl.constexpr, PASS: tl.constexpr):
    """split_rows_kernel for long rows, a program per (row, BLOCK_C chunk): PASS 0 writes each chunk's max |x| to
    cmax (R, NCHUNK); PASS 1 takes the row's scale from its chunks' maxima and writes the chunk's hi and lo (and
    chunk 0 the scale). A row per program would leave a few programs streaming megabytes each (KernelBench level 1
    problem 6: 256 rows of 524288)."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK_C + tl.arange(0, BLOCK_C)
    v = tl.load(x_ptr + row * stride_xr + offs.to(tl.int64) * stride_xc, mask=offs < C, other=0.0)
    if PASS == 0:
        tl.store(cmax_ptr + row * NCHUNK + chunk, tl.max(tl.abs(v), axis=0))
    else:
        c = tl.arange(0, NCHUNK_P2)
        s = _pow2_scale(tl.max(tl.load(cmax_ptr + row * NCHUNK + c, mask=c < NCHUNK, other=0.0), axis=0))
        if chunk == 0:
            tl.store(scale_ptr + row, s)
        vs = v * s
        hi = vs.to(tl.float16)
        lo = (vs - hi.to(tl.float32)).to(tl.float16)
        prow = parts_ptr + row * 2 * CP
        tl.store(prow + offs, hi, mask=offs < CP)
        tl.store(prow + CP + offs, lo, mask=offs < CP)


LONG_ROW = 16384  # rows past this many padded columns are split in chunks (split_chunks_kernel)
PAD_K = 64  # the largest BLOCK_K of any config: split parts' rows are zero-padded to a multiple of it
# K stretch of one power of two in a block-scaled A operand (gemm_tile's A_BLOCKS): one K block of the largest config
SCALE_BLOCK_K: tl.constexpr = tl.constexpr(PAD_K)


def padded_k(k: int) -> int:
    """The K a GEMM of two pre-split operands runs to: their rows are zero-padded to a multiple of PAD_K, so
    every K block is full (EVEN_K: unmasked, vectorized, pipelined loads). A masked K block at every step made
    1000 x 1000 -> 999 take 80-135 us on the H100 instead of ~15 (benchmarks/overhead/NOTES.md)."""
    return cdiv(k, PAD_K) * PAD_K


def _split_launch(x: torch.Tensor, write_parts: bool):
    assert x.dim() == 2 and x.dtype == torch.float32
    R, C = x.shape
    CP = padded_k(C)
    scale = torch.empty(R, device=x.device, dtype=torch.float32)
    parts = torch.empty(R, 2 * CP, device=x.device, dtype=torch.float16) if write_parts else scale
    if CP > LONG_ROW:
        block_c, nchunk = 4096, cdiv(CP, 4096)
        cmax = torch.empty(R, nchunk, device=x.device, dtype=torch.float32)
        for pass_ in (0, 1) if write_parts else (0,):
            split_chunks_kernel[(R, nchunk)](x, parts, scale, cmax, C, CP, nchunk, x.stride(0), x.stride(1),
                                             BLOCK_C=block_c, NCHUNK_P2=triton.next_power_of_2(nchunk), PASS=pass_,
                                             num_warps=8)
        if not write_parts:
            scale = _pow2_scale_torch(cmax.amax(1))
    else:
        block_c = min(triton.next_power_of_2(max(CP, 16)), 16384)
        num_warps = 8 if block_c >= 4096 else 4
        split_rows_kernel[(R,)](x, parts, scale, C, CP, x.stride(0), x.stride(1),
                                BLOCK_C=block_c, WRITE_PARTS=write_parts, num_warps=num_warps)
    if write_parts:  # (R, C) views; each row runs on in memory with zeros up to CP (padded_k)
        return parts[:, :C], parts[:, CP:CP + C], scale
    return None, None, scale


@triton.jit
def col_amax_kernel(t_ptr, amax_ptr, R, C, stride_c, stride_b, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """amax[b * R + r] = max_c |t[b, r, c]| for t (B, R, C) stored with unit row stride (t[b] = u[b]^T, u[b] (C, R)
    row-major): tiles read along r (coalesced), one atomic max per row and tile; program_id(2) = b. Bytes: t once."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r < R)[:, None] & (offs_c < C)[None, :]
    t_ptr += tl.program_id(2).to(tl.int64) * stride_b
    v = tl.load(t_ptr + offs_r[:, None] + offs_c[None, :].to(tl.int64) * stride_c, mask=mask, other=0.0)
    tl.atomic_max(amax_ptr + tl.program_id(2) * R + offs_r, tl.max(tl.abs(v), axis=1), mask=offs_r < R)


@triton.jit
def split_t_kernel(t_ptr, amax_ptr, parts_ptr, scale_ptr, R, C, CP, stride_c, stride_b,
                   BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """split_rows_kernel's output for t (B, R, C) stored with unit row stride: parts (B * R, 2 CP) fp16 = [hi | lo]
    of t[b, r] * s (s per row, from amax), zeros in columns C..CP; tiles read along r, written along c (Triton
    moves the tile between layouts in shared memory); program_id(2) = b. Bytes: t read once, 4 B/elem written."""
    b = tl.program_id(2)
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_r = offs_r < R
    t_ptr += b.to(tl.int64) * stride_b
    v = tl.load(t_ptr + offs_r[:, None] + offs_c[None, :].to(tl.int64) * stride_c,
                mask=mask_r[:, None] & (offs_c < C)[None, :], other=0.0)
    s = _pow2_scale(tl.load(amax_ptr + b * R + offs_r, mask=mask_r, other=1.0))
    if tl.program_id(1) == 0:
        tl.store(scale_ptr + b * R + offs_r, s, mask=mask_r)
    vs = v * s[:, None]
    hi = vs.to(tl.float16)
    lo = (vs - hi.to(tl.float32)).to(tl.float16)
    out = (b * R + offs_r)[:, None].to(tl.int64) * 2 * CP + offs_c[None, :]
    mask = mask_r[:, None] & (offs_c < CP)[None, :]
    tl.store(parts_ptr + out, hi, mask=mask)
    tl.store(parts_ptr + out + CP, lo, mask=mask)


def split_transposed(t: torch.Tensor, amax: torch.Tensor | None = None, pad: bool = True) -> tuple:
    """(hi, lo, scale) of the rows of t (R, C) or of every t[b] (B, R, C; rows b * R + r), for fp32 t stored with
    unit row stride (u.t() or u.transpose(-1, -2) of a row-major u), the same bits as split_x of t.contiguous(),
    without that transposed copy (torch's took 4.4 ms for a 524288 x 256 one on an H100). pad: rows run to
    padded_k(C) with zeros, as split_weight's (False: C). `amax`: max |row| where the caller has it."""
    t3 = t if t.dim() == 3 else t.unsqueeze(0)
    B, R, C = t3.shape
    CP = padded_k(C) if pad else C
    parts = torch.empty((B * R, 2 * CP), device=t.device, dtype=torch.float16)
    scale = torch.empty(B * R, device=t.device, dtype=torch.float32)
    br, bc = 64, 64
    if amax is None:
        amax = torch.zeros(B * R, device=t.device, dtype=torch.float32)
        col_amax_kernel[(cdiv(R, br), cdiv(C, bc), B)](t3, amax, R, C, t3.stride(2), t3.stride(0), BLOCK_R=br,
                                                      BLOCK_C=bc, num_warps=4)
    split_t_kernel[(cdiv(R, br), cdiv(CP, bc), B)](t3, amax, parts, scale, R, C, CP, t3.stride(2), t3.stride(0),
                                                  BLOCK_R=br, BLOCK_C=bc, num_warps=4)
    return parts[:, :C], parts[:, CP:CP + C], scale


def unit_row_stride(t: torch.Tensor) -> bool:
    """Is t (.., R, C) a transposed view (rows adjacent in memory, columns apart), each matrix one block?"""
    return t.stride(-2) == 1 and t.stride(-1) != 1 and t.stride(-1) >= t.shape[-2] and (
        t.dim() == 2 or t.stride(0) >= t.shape[-1] * t.stride(-1))


def split_weight(w: torch.Tensor) -> tuple:
    """W (N, K) fp32 -> (w_hi, w_lo, w_scale).  w_hi = parts[:, :K] and w_lo = parts[:, KP:KP + K] are views of ONE
    contiguous (N, 2 KP) fp16 tensor, KP = padded_k(K), zeros in columns K..KP of each half (so they share strides
    (2 KP, 1), and a kernel may run K up to KP unmasked); W[n] * w_scale[n] ~= w_hi[n] + w_lo[n] to
    ~2^-22 relative; w_scale (N,) fp32 powers of two.  Done once per weight; the caller caches the tuple.
    Cost: reads 4 and writes 4 bytes per weight element (W 8192x8192: 512 MiB moved, ~0.2 ms)."""
    return _split_launch(w.float().contiguous(), True)


def split_x(x: torch.Tensor) -> tuple:
    """x (M, K) fp32 -> (x_hi, x_lo, x_scale), same layout as split_weight (for configs with split_a=False).
    One Triton kernel: reads x once (4 B/elem), writes 4 B/elem + 4 B/row."""
    return _split_launch(x, True)


def row_scales(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) fp32 -> x_scale (M,): the per-row powers of two only (split_a=True configs; reads x once)."""
    return _split_launch(x, False)[2]


# ----------------------------------------------------------------------------------------------------------------
# the reusable tile
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def _fp16x3p_halves(a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, a_s, pid_m, pid_n, M, N, K,
                    stride_am, stride_ak, stride_bn, stride_bk,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SPLIT_A: tl.constexpr, EVEN_K: tl.constexpr):
    """fp16x3p for tiles too big for two full fp32 accumulators (e.g. 128x256 at 8 warps: 2 x 128 registers).
    The tile's columns are split into two halves, each with its own fp32 running sum (BLOCK_N/2 wide), and ONE
    fresh tensor-core partial (BLOCK_N/2 wide) is reused for both halves in turn: 3 half-size accumulators
    (192 registers/thread at 128x256, 8 warps) instead of 4.  Each K block loads A (hi, lo) once and uses it for
    both halves, so global/L2 traffic is that of the full tile.  Half 0 holds the even columns and half 1 the odd
    ones, so join + reshape back to (BM, BN) moves no data between threads."""
    HALF: tl.constexpr = BLOCK_N // 2
    offs_j = tl.arange(0, HALF)
    offs_k = tl.arange(0, BLOCK_K)
    # Scalar 64-bit tile bases + int32 offsets relative to them (rows/cols past M/N clamped onto the last valid
    # one, never stored): one register per loaded vector instead of a 64-bit pointer, and hi/lo share offsets.
    m0 = pid_m * BLOCK_M
    n_first = pid_n * BLOCK_N
    rel_m = tl.minimum(m0 + tl.arange(0, BLOCK_M), M - 1) - m0
    rel_n0 = tl.minimum(n_first + 2 * offs_j, N - 1) - n_first
    rel_n1 = tl.minimum(n_first + 2 * offs_j + 1, N - 1) - n_first
    a_off = rel_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b0_off = rel_n0[None, :] * stride_bn + offs_k[:, None] * stride_bk
    b1_off = rel_n1[None, :] * stride_bn + offs_k[:, None] * stride_bk
    a_base = a_ptr + m0.to(tl.int64) * stride_am
    a_lo_base = a_lo_ptr + m0.to(tl.int64) * stride_am
    b_base = b_ptr + n_first.to(tl.int64) * stride_bn
    b_lo_base = b_lo_ptr + n_first.to(tl.int64) * stride_bn
    acc0 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_base + a_off)
            b0 = tl.load(b_base + b0_off)
            b0_lo = tl.load(b_lo_base + b0_off)
            b1 = tl.load(b_base + b1_off)
            b1_lo = tl.load(b_lo_base + b1_off)
        else:
            k_left = K - kb * BLOCK_K
            a = tl.load(a_base + a_off, mask=offs_k[None, :] < k_left, other=0.0)
            b0 = tl.load(b_base + b0_off, mask=offs_k[:, None] < k_left, other=0.0)
            b0_lo = tl.load(b_lo_base + b0_off, mask=offs_k[:, None] < k_left, other=0.0)
            b1 = tl.load(b_base + b1_off, mask=offs_k[:, None] < k_left, other=0.0)
            b1_lo = tl.load(b_lo_base + b1_off, mask=offs_k[:, None] < k_left, other=0.0)
        if SPLIT_A:
            av = a * a_s[:, None]  # exact (power of two)
            a_hi = av.to(tl.float16)
            a_lo = (av - a_hi.to(tl.float32)).to(tl.float16)
        else:
            a_hi = a
            if EVEN_K:
                a_lo = tl.load(a_lo_base + a_off)
            else:
                a_lo = tl.load(a_lo_base + a_off, mask=offs_k[None, :] < k_left, other=0.0)
        part = tl.dot(a_lo, b0)
        part = tl.dot(a_hi, b0_lo, part)
        part = tl.dot(a_hi, b0, part)
        acc0 = acc0 + part
        part = tl.dot(a_lo, b1)
        part = tl.dot(a_hi, b1_lo, part)
        part = tl.dot(a_hi, b1, part)
        acc1 = acc1 + part
        a_base += BLOCK_K * stride_ak
        a_lo_base += BLOCK_K * stride_ak
        b_base += BLOCK_K * stride_bk
        b_lo_base += BLOCK_K * stride_bk
    return tl.reshape(tl.join(acc0, acc1), (BLOCK_M, BLOCK_N))


@triton.jit
def _load_k_block(a_ptrs, b_ptrs, offs_k, kb, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """K block `kb` of the fp32 operands: A (BLOCK_M, BLOCK_K) and B (BLOCK_K, BLOCK_N), zeros past K."""
    if EVEN_K:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    else:
        k_left = K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
    return a, b


@triton.jit
def _tile_row_scales(a_ptr, offs_am, K, stride_am, stride_ak, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """The powers of two split_rows_kernel would give these rows of x (from max |x[m, :]|), computed in the GEMM
    program itself (SPLIT_A=2): one more read of the tile's rows, which small GEMMs (launch-bound: see
    default_config) pay gladly to drop a launch."""
    offs_k = tl.arange(0, BLOCK_K)
    ptrs = a_ptr + offs_am[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    m = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(ptrs, mask=offs_k[None, :] < K - kb * BLOCK_K, other=0.0)
        m = tl.maximum(m, tl.max(tl.abs(a), axis=1))
        ptrs += BLOCK_K * stride_ak
    return _pow2_scale(m)


@triton.jit
def gemm_tile(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr,
              pid_m, pid_n, M, N, K,
              stride_am, stride_ak, stride_bn, stride_bk,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              SCHEME: tl.constexpr, SPLIT_A: tl.constexpr, EVEN_K: tl.constexpr,
              K_SLICES: tl.constexpr = 0, A_BLOCKS: tl.constexpr = False):
    """Return the fp32 (BLOCK_M, BLOCK_N) tile acc[i, j] = sum_k A[m_i, k] * B[n_j, k] (= (x @ W^T) tile) for
    rows m_i = pid_m*BLOCK_M + i, cols n_j = pid_n*BLOCK_N + j.  Rows/cols past M/N are computed from wrapped
    (valid) indices: the caller must mask its store with (offs_m < M) & (offs_n < N).

    Operands by SCHEME:
      "ieee", "tf32x3", "fp64": a_ptr = x fp32 (M, K), b_ptr = W fp32 (N, K); the *_lo_ptr / *_scale_ptr are unused.
      "fp16x3p": b_ptr, b_lo_ptr = w_hi, w_lo fp16 (N, K) sharing strides (stride_bn, stride_bk),
          b_scale_ptr = w_scale (N,) (split_weight); SPLIT_A=True: a_ptr = x fp32, a_scale_ptr = x_scale (M,)
          (row_scales), a_lo_ptr unused; SPLIT_A=2: the same, the row scales computed here (a_scale_ptr unused);
          SPLIT_A=False: a_ptr, a_lo_ptr = x_hi, x_lo fp16 (M, K) sharing strides
          (stride_am, stride_ak), a_scale_ptr = x_scale (split_x).
    EVEN_K: K % BLOCK_K == 0 (drops the K mask from the loads; set by the launcher, any K is handled otherwise).
    Tiles with BLOCK_M*BLOCK_N > HALVES_ABOVE run fp16x3p as two column halves (even/odd columns) sharing one
    tensor-core partial (_fp16x3p_halves).
    K_SLICES ("fp64" only): 0 = this tile sums K itself; S >= 1 = K was already summed by skinny.fp64_split_k_kernel
    into S float64 partials (or by runtime.split_k_partials into S fp32 ones): a_ptr = P (S, M, N) with stride_am =
    its row stride, stride_ak = its slice stride, stride_bn = its column stride (skinny.fp64_partials returns them);
    the tile adds the S slices in order, in float64.
    A_BLOCKS ("fp16x3p", SPLIT_A=False, the plain K loop only): A is split per (row, SCALE_BLOCK_K-long stretch of K)
    with its own power of two, and B carries no scales of its own (they were folded into A: kernels/backward.py,
    gemm_dw_presplit): a_scale_ptr = the inverse scales, (rows of A, cdiv(K, SCALE_BLOCK_K)) row-major; each K
    block's fresh tensor-core partial is added times its rows' inverse scales (an FMA where the plain loop adds),
    and b_scale_ptr is not read.
    """
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Wrap out-of-range rows/cols onto valid ones so the loads need no M/N mask (their results are never stored).
    offs_am = offs_m % M
    offs_bn = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    a_off = offs_am[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    b_off = offs_bn[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SCHEME == "ieee" or SCHEME == "tf32x3":
        a_ptrs = a_ptr + a_off
        b_ptrs = b_ptr + b_off
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            a, b = _load_k_block(a_ptrs, b_ptrs, offs_k, kb, K, BLOCK_K, EVEN_K)
            acc = tl.dot(a, b, acc, input_precision=SCHEME)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
    elif SCHEME == "fp64" and K_SLICES > 0:
        # add the float64 K-slice partials in a fixed order (deterministic), then round once to fp32
        acc64 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
        p_ptrs = a_ptr + offs_am[:, None].to(tl.int64) * stride_am + offs_bn[None, :].to(tl.int64) * stride_bn
        for s in tl.static_range(K_SLICES):
            acc64 += tl.load(p_ptrs + s * stride_ak)
        acc = acc64.to(tl.float32)
    elif SCHEME == "fp64":
        # a multiply and a sum over K (no tl.dot: float64 dots are not lowered on every target); the
        # (BLOCK_M, BLOCK_K, BLOCK_N) product stays small because BLOCK_M covers a skinny M (skinny_configs)
        acc64 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
        a_ptrs = a_ptr + a_off
        b_ptrs = b_ptr + b_off
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            a, b = _load_k_block(a_ptrs, b_ptrs, offs_k, kb, K, BLOCK_K, EVEN_K)
            acc64 += tl.sum(a.to(tl.float64)[:, :, None] * b.to(tl.float64)[None, :, :], axis=1)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        acc = acc64.to(tl.float32)
    else:
        tl.static_assert(SCHEME == "fp16x3p", "gemm_tile's schemes: ieee, tf32x3, fp64, fp16x3p")
        if A_BLOCKS:
            tl.static_assert(not SPLIT_A and BLOCK_M * BLOCK_N <= HALVES_ABOVE,
                             "A_BLOCKS runs fp16x3p's plain K loop on pre-split operands")
            tl.static_assert(SCALE_BLOCK_K % BLOCK_K == 0, "a K block must lie inside one scale block")
            s_ptrs = a_scale_ptr + offs_am.to(tl.int64) * tl.cdiv(K, SCALE_BLOCK_K)
        elif SPLIT_A == 2:  # the rows' scales from one extra pass over this tile's rows: no row_scales launch
            a_s = _tile_row_scales(a_ptr, offs_am, K, stride_am, stride_ak, BLOCK_M, BLOCK_K)
        else:
            a_s = tl.load(a_scale_ptr + offs_am)
        if BLOCK_M * BLOCK_N > HALVES_ABOVE:
            acc = _fp16x3p_halves(a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, a_s, pid_m, pid_n, M, N, K, stride_am, stride_ak,
                                  stride_bn, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_A, EVEN_K)
        else:
            # one K loop, three dots per K block into a fresh tensor-core partial, added with a round-to-nearest FADD
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
                part = tl.dot(a_lo, b)
                part = tl.dot(a_hi, b_lo, part)
                part = tl.dot(a_hi, b, part)
                if A_BLOCKS:  # this K block's stretch of A was scaled on its own: undo it here (exact)
                    acc = acc + part * tl.load(s_ptrs + (kb * BLOCK_K) // SCALE_BLOCK_K)[:, None]
                else:
                    acc = acc + part
                a_ptrs += BLOCK_K * stride_ak
                a_lo_ptrs += BLOCK_K * stride_ak
                b_ptrs += BLOCK_K * stride_bk
                b_lo_ptrs += BLOCK_K * stride_bk
        if not A_BLOCKS:  # undo the row/col powers of two (exact)
            b_s = tl.load(b_scale_ptr + offs_bn)
            acc = acc * _pow2_inv(a_s)[:, None] * _pow2_inv(b_s)[None, :]
    return acc


@triton.jit
def _tile_ids(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row-blocks share each sweep over the column blocks, so their W tiles are reused
    from L2 while they are hot."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_in_group = GROUP_M * num_pid_n
    group_id = tile // num_in_group
    first_m = group_id * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % num_in_group) % group_size
    pid_n = (tile % num_in_group) // group_size
    return pid_m, pid_n


# ----------------------------------------------------------------------------------------------------------------
# the tile in a kernel: y = LeakyReLU((x @ W^T + bias) * mult, slope) (KernelBench problem 12), as the tests and
# benchmarks drive gemm_tile (generated files make their own kernels around it: regions/common.py)
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def gemm_bias_mul_leakyrelu_kernel(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, bias_ptr, out_ptr,
                                   M, N, K, stride_am, stride_ak, stride_bn, stride_bk, stride_om, stride_on,
                                   mult, slope,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                   GROUP_M: tl.constexpr, SCHEME: tl.constexpr, SPLIT_A: tl.constexpr,
                                   EVEN_K: tl.constexpr, K_SLICES: tl.constexpr = 0):
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = gemm_tile(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr,
                    pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bn, stride_bk,
                    BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, SPLIT_A, EVEN_K, K_SLICES=K_SLICES)
    # epilogue on the fp32 accumulator, then a masked store
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
    y = (acc + bias[None, :]) * mult
    y = tl.where(y >= 0, y, y * slope)
    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, y, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def gemm_bias_mul_leakyrelu(x: torch.Tensor, w_parts, bias: torch.Tensor, mult: float, slope: float,
                            scheme: str = DEFAULT_SCHEME, config: GemmConfig | None = None,
                            x_parts: tuple | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = LeakyReLU((x @ W^T + bias) * mult, slope), x (M, K) fp32.
    w_parts: the fp32 W (N, K) for "ieee"/"tf32x3"/"fp64"; split_weight(W) for "fp16x3p".
    x_parts: optional precomputed split_x(x) / (None, None, row_scales(x)) -- otherwise computed here (and timed
    as part of the call).  "fp64" with config.k_slices: x_parts = skinny.fp64_partials(x, W, config) (required)."""
    assert scheme in SCHEMES, scheme
    M, K = x.shape
    if scheme in SPLIT_SCHEMES:
        w_hi, w_lo, w_scale = w_parts
        N = w_hi.shape[0]
        assert w_hi.dtype == torch.float16 and w_hi.stride() == w_lo.stride()
    else:
        w = w_parts[0] if isinstance(w_parts, (tuple, list)) else w_parts
        N = w.shape[0]
    cfg = config or default_config(M, N, K, scheme)
    assert supports(cfg, scheme, K), cfg
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
    grid = (cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n),)
    gemm_bias_mul_leakyrelu_kernel[grid](
        a, a_lo, a_s, b, b_lo, b_s, bias, out, M, N, k_run, *strides, out.stride(0), out.stride(1),
        float(mult), float(slope),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        SCHEME=scheme, SPLIT_A=cfg.split_a, EVEN_K=(k_run % cfg.block_k == 0), K_SLICES=cfg.k_slices,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def gemm_bias_mul_leakyrelu_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, mult: float,
                                slope: float) -> torch.Tensor:
    """Plain torch reference (computes in x's dtype: pass float64 tensors for the accuracy reference)."""
    y = (x @ w.t() + bias) * mult
    return torch.nn.functional.leaky_relu(y, slope)


# ----------------------------------------------------------------------------------------------------------------
# configs: each scheme's config space, the default per shape, and the one check of what the kernels can run
# ----------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    # fp16x3p: split x inside the GEMM (True) or by split_x beforehand (False); 2: inside the GEMM, and the rows'
    # scales too (no row_scales launch; for small, launch-bound GEMMs)
    split_a: bool | int = True
    persistent: bool = False  # sm90 only: a block per SM walks the tiles (regions/sm90_twin.py)
    # k_slices = S >= 1: "fp64" runs skinny.fp64_split_k_kernel first (S K slices, column tiles of split_block_n,
    # K blocks of block_k), fp16x3p runtime.split_k_partials (one tile per slice, K >= LONG_K); then the
    # tile kernel (block_m x block_n) adds the S partials in float64
    k_slices: int = 0
    split_block_n: int = 16
    # sm90: the region kernel's Hopper twin runs, its GEMM tile in Gluon (kernels/gemm_sm90.py: asynchronous wgmma,
    # a producer warp); num_stages is its shared-memory stages, chunk the K blocks its hi*hi partial sums between
    # promotions. Pre-split operands only (split_a=False).
    sm90: bool = False
    chunk: int = 4  # more failed problem 39's BatchNorm running mean (sm90_configs)
    # not a field: kernels/backward.py (gemm_dw_presplit) still reads it; TMA tile loads are benchmarks/gemm's
    tma = False

    def short(self) -> str:
        s = f"{self.block_m}x{self.block_n}x{self.block_k}_g{self.group_m}_w{self.num_warps}_s{self.num_stages}"
        if self.split_a is False:
            s += "_presplit"
        elif self.split_a == 2:
            s += "_ksc"
        if self.persistent:
            s += "_pers"
        if self.k_slices:
            s += f"_ks{self.k_slices}x{self.split_block_n}"
        if self.sm90:
            s += f"_sm90c{self.chunk}"
        return s


LONG_K = 32768  # longer K: one tile's sequential fp32 sum over its K blocks is less accurate than cuBLAS's
# split-K GEMM (KernelBench level 1 problem 6, 256 x 256 x 524288: 0.75 from float64 against eager's 0.27, rule 3
# missed) and a few tiles leave the GPU idle; K is cut into slices summed in float64 (long_k_configs)


def supports(cfg: GemmConfig, scheme: str, K: int, min_block_n: int = 16, batch: int = 1, sm90: bool = False,
             a_blocks: bool = False) -> bool:
    """Whether kfuse's GEMM kernels can run `cfg` for a GEMM of depth K under `scheme`: the one validity check.
    The config spaces are built with it, the tuner keeps only the candidates it accepts, and the tests hold every
    default to it.
      min_block_n: the smallest column tile the kernel's epilogue takes (whole GroupNorm groups, a pooling window);
      batch: products in one launch (runtime.batched_operands: no split-K, no Hopper twin);
      sm90: the launch may pick the kernel's Hopper twin (runtime.sm90_ok: Gluon, a compiled run on a Hopper GPU);
      a_blocks: the tile's A_BLOCKS loop (kernels/backward.py, gemm_dw_presplit), which launches the tile alone:
        pre-split, without split-K, whatever cfg's split_a and k_slices say."""
    if a_blocks:
        return scheme == "fp16x3p" and cfg.block_m * cfg.block_n <= HALVES_ABOVE.value and PAD_K % cfg.block_k == 0
    if scheme not in SCHEMES or cfg.block_n < min_block_n:
        return False
    if cfg.k_slices and (batch > 1 or scheme not in ("fp64",) + SPLIT_SCHEMES):
        return False  # the tile adds the slices' partials of one product: fp64 sums, or fp16x3p's split-K pass
    if cfg.sm90:  # pre-split fp16x3p; its cross products sum all of K in one tensor-core accumulator
        return sm90 and batch == 1 and scheme == "fp16x3p" and cfg.split_a is False and not cfg.k_slices and K < LONG_K
    return not cfg.persistent  # the Triton kernels run one program per tile


def long_k_configs(M: int, N: int, K: int) -> list[GemmConfig]:
    """Split-K configs of fp16x3p for K >= LONG_K: S slices of about 4096-8192 of K, each a GEMM tile of
    its own (runtime.split_k_partials: fp32 partials over one slice each), then the region's tile adds the S
    partials in float64 in a fixed order (gemm_tile's K_SLICES) and runs its epilogue."""
    if K < LONG_K:
        return []
    return [GemmConfig(bm, 128, 64, 8, warps, 3, split_a=False, k_slices=cdiv(K, step))
            for step in (8192, 4096) for bm, warps in ((128, 8), (64, 4))]


def valid_configs(M: int, N: int, K: int, scheme: str) -> list[GemmConfig]:
    """The Triton tile's config space per scheme: what the tuner times (each entry compiled and timed by
    benchmarks/gemm/explore.py).  Shared memory per stage for fp16x3p: (BM + BN) * BK * 4 bytes (hi + lo fp16 of
    A and B) -- the H100's 227 KB cap the stages (128x128x64: 3 stages = 192 KB).  Registers: a 128x128 fp32 tile
    over 8 warps is 64 registers/thread per accumulator; fp16x3p holds two (partial + sum); 128x256 ones (128 each)
    would spill."""
    if scheme == "fp64":
        return skinny_configs(M)
    if scheme in ("ieee", "tf32x3"):
        return [GemmConfig(128, 128, 32, 8, 8, 3), GemmConfig(128, 64, 32, 8, 4, 4),
                GemmConfig(64, 64, 32, 8, 4, 3), GemmConfig(128, 256, 32, 8, 8, 3)]
    if scheme != "fp16x3p":
        raise ValueError(f"unknown GEMM scheme {scheme!r}")
    if K >= LONG_K:
        return long_k_configs(M, N, K)
    small = [GemmConfig(128, 128, 64, 8, 8, 3, split_a=2), GemmConfig(64, 128, 64, 8, 4, 3, split_a=2)]
    return [GemmConfig(128, 128, 64, 8, 8, 3, split_a=False), GemmConfig(128, 128, 64, 16, 8, 3, split_a=False),
            GemmConfig(128, 128, 32, 8, 8, 5, split_a=False), GemmConfig(128, 128, 64, 8, 8, 3),
            GemmConfig(64, 128, 64, 8, 4, 3, split_a=False)] + (small if launch_bound(M, N, K) else [])


SM90_CONFIGS = (GemmConfig(128, 128, 64, 8, 8, 3, split_a=False, sm90=True, chunk=4),
                GemmConfig(128, 128, 64, 8, 8, 3, split_a=False, persistent=True, sm90=True, chunk=4))


def sm90_configs(M: int, N: int, K: int, scheme: str) -> list[GemmConfig]:
    """The Hopper twin's configs (kernels/gemm_sm90.py), where it can run them (supports): 128 x 128 x 64 tiles
    (three fp32 accumulators fill 192 of the consumers' 240 registers), 3 stages of 64 KB, the hi*hi partial
    promoted every 4 K blocks (longer chunks failed problem 39's BatchNorm running mean by their truncation bias:
    benchmarks/gemm/NOTES.md, the Gluon twin's promotion chunk). H100: problem 12's GEMM kernel 0.55 ms (Triton
    tile 0.69), problem 39's 2.44-2.59 ms (2.97). One block per tile, and persistent (a block per SM walks the
    tiles: regions/sm90_twin.py). Skipped where launches set the time."""
    if launch_bound(M, N, K):
        return []
    return [c for c in SM90_CONFIGS if supports(c, scheme, K, sm90=True)]


def sm90_maxnreg(num_warps: int) -> int:
    """Registers per thread at launch for a Hopper twin (GEMM or convolution) of num_warps consumer warps, one block
    per SM: they and the producer warp's group of 4 share the SM's 65536 (8 warps: 168). The producer then drops to
    24 (setmaxnreg), which lifts the consumers to 240."""
    return 65536 // ((num_warps + 4) * 32) // 8 * 8


def skinny_configs(M: int) -> list[GemmConfig]:
    """The "fp64" configs, split-K first (the default); see kernels/skinny.py and benchmarks/skinny/NOTES.md.

    Split-K (k_slices = S): the split pass keeps a (bm * split_block_n, block_k) float64 accumulator, bm = the
    power of two covering M (1 at a batch of 1), at most 4096 elements per 4 warps (64 registers/thread); block_k
    shrinks as bm grows to stay inside.  At N = K = 8192, M = 1 the default (16 x 256 blocks, S = 4) is 2048
    programs each streaming 128 KiB of W in 16 KiB steps.  The tile kernel that adds the partials and runs the
    epilogue uses (max(bm, 2), 64) tiles (the region may widen block_n; it reads only S * M * N * 8 bytes).
    In-tile (k_slices = 0): the GEMM tile itself sums K in float64, BLOCK_M * BLOCK_K * BLOCK_N <= 4096
    products per K step; N / BLOCK_N programs each stream a full (BLOCK_N, K) block of W (kept for the tuner)."""
    bm = min(triton.next_power_of_2(max(M, 1)), SKINNY_M)
    tile_m = max(bm, 2)
    splits = ((16, 256, 4, 4, 3), (16, 256, 8, 4, 3), (16, 256, 2, 4, 3), (8, 512, 4, 4, 3), (32, 128, 4, 4, 3),
              (32, 256, 4, 8, 3), (16, 256, 4, 4, 1))  # (split_block_n, block_k at bm = 1, S, warps, stages)
    out = []
    for sbn, bk1, slices, warps, stages in splits:
        bk = max(16, bk1 // bm)
        cfg = GemmConfig(tile_m, 64, bk, 1, warps, stages, k_slices=slices, split_block_n=sbn)
        if bm * sbn * bk <= 1024 * warps and cfg not in out:
            out.append(cfg)
    tiles = ((32, 64), (64, 32), (16, 16))  # in-tile (BLOCK_N, BLOCK_K)
    out += [GemmConfig(tile_m, bn, bk, 1, 4, 3) for bn, bk in tiles if tile_m * bn * bk <= 4096]
    return out


# GEMMs this small (problems/gemm/33: 1000 x 1000 -> 999, 2 GFLOP of fp16 products, ~10 us of tensor-core work)
# should be set by launch overhead, not by the GPU: the tuner also tries SPLIT_A=2 (one launch fewer) there.
LAUNCH_BOUND_MNK = 2 ** 31


def launch_bound(M: int, N: int, K: int) -> bool:
    return M * N * K <= LAUNCH_BOUND_MNK


# Triton's CPU interpreter runs each program's every K step as a few numpy calls, so a GEMM's time there is about
# its number of (program, K step) pairs: fewer, larger tiles are faster. Small GEMMs take INTERPRETER_CONFIG; wide
# or deep ones wider tiles (interpreter_config): VGG16's classifier Linear (1 x 25088 -> 4096) took ~60 s a call
# in 32x64x32 tiles (50,176 steps), ~1,600 steps in 32x256x256.
INTERPRETER_CONFIG = GemmConfig(32, 64, 32, 8, 4, 1)
INTERPRETER_WIDE_N = 1024  # wider outputs take 256-column tiles
INTERPRETER_DEEP_K = 256  # deeper products take 256-deep K steps


def interpreter_config(M: int, N: int, K: int, scheme: str) -> GemmConfig:
    """The interpreter's tile for one GEMM: INTERPRETER_CONFIG, widened where N or K is large. The "fp64" scheme
    (a batch of at most SKINNY_M rows) runs its split-K pass as one K slice of 256-column, 256-deep steps: the
    GPU's many slices keep bytes in flight, which the interpreter, one program at a time, does not need."""
    wide, deep = N > INTERPRETER_WIDE_N, K > INTERPRETER_DEEP_K
    if scheme == "fp64":
        return dataclasses.replace(skinny_configs(M)[0], block_k=256 if deep else 32, k_slices=1,
                                   split_block_n=256 if wide else 16)
    return dataclasses.replace(INTERPRETER_CONFIG, block_n=256 if wide else 64, block_k=256 if deep else 32)


def default_config(M: int, N: int, K: int, scheme: str, interpret: bool = False) -> GemmConfig:
    """Best measured config per shape class on the H100 (benchmarks/gemm/NOTES.md).  Large shapes measured:
    1024x8192->8192 and 16384x4096->4096.  Small-M entries are untimed guesses (they only need to be correct).
    `interpret`: kernels run in Triton's CPU interpreter (its "ieee" and "fp64" GEMMs take interpreter_config)."""
    small = M < 128 or N < 128
    if scheme in ("ieee", "fp64") and interpret:
        return interpreter_config(M, N, K, scheme)
    if scheme == "fp64":
        return skinny_configs(M)[0]
    if scheme == "fp16x3p" and K >= LONG_K:
        return long_k_configs(M, N, K)[0]
    if scheme in ("ieee", "tf32x3"):
        return GemmConfig(64, 64, 32, 8, 4, 3) if small else GemmConfig(128, 128, 32, 8, 8, 3)
    if scheme == "fp16x3p":
        # not SPLIT_A=2 here, though it saves a launch: on the H100 problem 33's GEMM (1000 x 1000 -> 999) took
        # 236 us per call with it (torch.profiler, benchmarks/overhead/NOTES.md), cause not yet profiled; the
        # tuner still times it for launch-bound shapes (valid_configs) and keeps it only where it is faster
        return GemmConfig(64, 128, 64, 8, 4, 3, split_a=False) if small else GemmConfig(128, 128, 64, 8, 8, 3,
                                                                                         split_a=False)
    raise ValueError(f"unknown GEMM scheme {scheme!r}")


# ----------------------------------------------------------------------------------------------------------------
# device facts
# ----------------------------------------------------------------------------------------------------------------
_NUM_SMS = {}


def ensure_tma_allocator() -> None:
    """Device-side tensor descriptors (the Hopper twin's TMA loads) need a global-memory scratch allocator; set a
    torch-backed one once (callers launching sm90 configs themselves must call this before launching)."""
    global _TMA_ALLOC_SET
    if not _TMA_ALLOC_SET:
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        _TMA_ALLOC_SET = True


_TMA_ALLOC_SET = False


def _num_sms(device) -> int:
    if device not in _NUM_SMS:
        cuda = device.type == "cuda"
        _NUM_SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 4
    return _NUM_SMS[device]
