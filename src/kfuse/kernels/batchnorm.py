"""BatchNorm1d's cross-tile statistics: per-tile partials -> per-column mean and 1/std (+ running stats).

The GEMM epilogue of a GEMM + BatchNorm1d region writes, for each (row tile, column), the tile's count-free
mean and M2 = sum((y - tile_mean)^2): centred within the tile, so no E[y^2] - E[y]^2 cancellation.
`batch_norm_finalize_kernel` merges the tiles of each column in closed form (Chan et al.'s parallel
combination: the overall mean, then each tile's M2 plus n_t (tile mean - mean)^2), in float64.
Bytes: 2 * num_row_tiles * N * 4 read (4 MB for 16384 x 4096 with 128-row tiles), negligible next to the GEMM.
Torch's semantics: normalize with the biased variance M2 / M; the running variance gets the unbiased
M2 / (M - 1); running = (1 - momentum) * running + momentum * batch.
Eval mode (`bn-eval-fold`, the BatchNorm region kind): `bn_eval_fold` folds the running statistics, the affine
and per-feature scales into the GEMM's weight and bias (float64, rounded once), cached on the weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.kernels.gemm_core import cdiv
from kfuse.kernels.runtime import tensor_key


def batch_norm_stats_ref(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch reference: per-column mean and biased variance of y (M, N)."""
    return y.mean(0), y.var(0, unbiased=False)


# --- emitted below ---
@triton.jit
def _tile_counts(t, count_ptr, M, num_tiles, TILE_M: tl.constexpr, COUNTED: tl.constexpr):
    """Rows in each row tile t (float64; 0 past the last tile): read from count_ptr where COUNTED (a convolution's
    tiles, which stride phases make unequal), else TILE_M in every tile but the last (a GEMM's)."""
    if COUNTED:
        n = tl.load(count_ptr + t, mask=t < num_tiles, other=0.0).to(tl.float64)
    else:
        n = tl.where(t < num_tiles, tl.minimum(M - t * TILE_M, TILE_M), 0).to(tl.float64)
    return n


@triton.jit
def batch_norm_finalize_kernel(mean_part_ptr, m2_part_ptr, count_ptr, mean_ptr, rstd_ptr, running_mean_ptr,
                               running_var_ptr, M, N, num_tiles, eps, momentum,
                               TILE_M: tl.constexpr, COUNTED: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK: tl.constexpr,
                               UPDATE: tl.constexpr):
    """BLOCK columns a program, all row tiles at once (BLOCK_T a load): mean = sum_t n_t mean_t / M, then
    M2 = sum_t (M2_t + n_t (mean_t - mean)^2), in float64. The per-column loop over tiles this replaced waited
    on each tile's load in turn (27 us for 128 tiles x 4096 columns on the H100)."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask_c = cols < N
    total = tl.zeros((BLOCK,), dtype=tl.float64)
    for t0 in range(0, num_tiles, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        part = t[:, None] * N + cols[None, :]
        mask = (t < num_tiles)[:, None] & mask_c[None, :]
        mean_t = tl.load(mean_part_ptr + part, mask=mask, other=0.0).to(tl.float64)
        total += tl.sum(_tile_counts(t, count_ptr, M, num_tiles, TILE_M, COUNTED)[:, None] * mean_t, axis=0)
    mean = total / M
    m2 = tl.zeros((BLOCK,), dtype=tl.float64)
    for t0 in range(0, num_tiles, BLOCK_T):  # again (from L2): the centring needs the mean over all tiles
        t = t0 + tl.arange(0, BLOCK_T)
        part = t[:, None] * N + cols[None, :]
        mask = (t < num_tiles)[:, None] & mask_c[None, :]
        dev = tl.load(mean_part_ptr + part, mask=mask, other=0.0).to(tl.float64) - mean[None, :]
        m2_t = tl.load(m2_part_ptr + part, mask=mask, other=0.0).to(tl.float64)
        m2 += tl.sum(m2_t + _tile_counts(t, count_ptr, M, num_tiles, TILE_M, COUNTED)[:, None] * dev * dev, axis=0)
    var = m2 / M
    tl.store(mean_ptr + cols, mean.to(tl.float32), mask=mask_c)
    tl.store(rstd_ptr + cols, (1.0 / tl.sqrt(var + eps)).to(tl.float32), mask=mask_c)
    if UPDATE:
        rm = tl.load(running_mean_ptr + cols, mask=mask_c).to(tl.float64)
        rv = tl.load(running_var_ptr + cols, mask=mask_c).to(tl.float64)
        tl.store(running_mean_ptr + cols, (1.0 - momentum) * rm + momentum * mean, mask=mask_c)
        tl.store(running_var_ptr + cols, (1.0 - momentum) * rv + momentum * (m2 / (M - 1)), mask=mask_c)


def batch_norm_stats(mean_part: torch.Tensor, m2_part: torch.Tensor, M: int, tile_rows: int | torch.Tensor,
                     bn: torch.nn.Module, factor: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-column mean and 1/sqrt(var + eps) from the (num_tiles, N) partials of M values per column; with
    `factor` (the momentum, or 1/num_batches_tracked when momentum is None) also update bn's running statistics in
    place. `tile_rows`: the rows of every tile but the last (a GEMM's), or each tile's rows as a (num_tiles, N)
    tensor, the same in every column (a convolution's statistics kernel stores it so, beside the moments)."""
    num_tiles, N = mean_part.shape
    if isinstance(tile_rows, torch.Tensor):
        tile_rows = tile_rows[:, 0].contiguous()
    mean = torch.empty(N, device=mean_part.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    update = factor is not None
    rm = bn.running_mean if update else mean
    rv = bn.running_var if update else mean
    counted = isinstance(tile_rows, torch.Tensor)
    block = 32  # 128 programs for 4096 columns
    batch_norm_finalize_kernel[(cdiv(N, block),)](
        mean_part, m2_part, tile_rows if counted else mean_part, mean, rstd, rm, rv, M, N, num_tiles, float(bn.eps),
        float(factor or 0.0), TILE_M=1 if counted else tile_rows, COUNTED=counted,
        BLOCK_T=min(triton.next_power_of_2(num_tiles), 128), BLOCK=block, UPDATE=update)
    if update:  # the kernel wrote them behind torch's back: bump their versions as an in-place torch op would,
        torch.autograd.graph.increment_version((bn.running_mean, bn.running_var))  # so bn_eval_fold's cache sees it
    return mean, rstd


def batch_norm_momentum(bn: torch.nn.Module) -> float | None:
    """Torch's bookkeeping before a training-mode forward: count the batch, return the update factor
    (None when no running statistics are updated)."""
    if not (bn.training and bn.track_running_stats):
        return None
    if bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
    return 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else float(bn.momentum)


def batch_norm_fold(weight: torch.Tensor, bias: torch.Tensor | None, scales: tuple, running_mean: torch.Tensor,
                    running_var: torch.Tensor, gamma: torch.Tensor | None, beta: torch.Tensor | None, eps: float,
                    kn_layout: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Eval-mode BatchNorm of (x W^T + b) * c (c: the product of the per-feature `scales`) as one affine map
    x W'^T + b', exact in real arithmetic: with g = gamma / sqrt(running_var + eps) and s = c * g,
        W' = W * s (per output feature),  b' = (b * c - running_mean) * g + beta.
    All in float64, each result rounded
    once: W' to the weight's dtype (what the GEMM reads), b' to fp32 or wider (the epilogue adds it to the fp32
    accumulator).
    `kn_layout`: W is (K, N) (`x @ W`), so features are its columns."""
    f64 = torch.float64
    c = torch.ones((), dtype=f64, device=weight.device)
    for t in scales:
        c = c * t.to(f64).reshape(-1)
    g = (running_var.to(f64) + eps).rsqrt()
    if gamma is not None:
        g = g * gamma.to(f64)
    s = c * g
    w = weight.to(f64) * (s[None, :] if kn_layout else s[:, None])
    b = torch.zeros((), dtype=f64, device=weight.device) if bias is None else bias.to(f64)
    b = (b * c - running_mean.to(f64)) * g
    if beta is not None:
        b = b + beta.to(f64)
    n = weight.shape[1] if kn_layout else weight.shape[0]
    return w.to(weight.dtype), b.expand(n).to(torch.promote_types(weight.dtype, torch.float32)).contiguous()


def _version_key(t: torch.Tensor | None) -> tuple:
    return () if t is None else tensor_key(t)


def bn_eval_fold(weight: torch.Tensor, bias: torch.Tensor | None, scales: tuple, bn: torch.nn.Module,
                 kn_layout: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(W', b') of batch_norm_fold for this BatchNorm's running statistics, cached on the weight and reused while
    every tensor it reads (W, b, the scales, running_mean, running_var, gamma, beta) keeps its storage, version
    counter and shape, and eps is the same: load_state_dict, an optimizer step, an in-place change and a
    training-mode call (batch_norm_stats bumps the running statistics' versions) all recompute it. As with
    cached_split, a write through `.data` bypasses the version counter: set `weight._kfuse_bn_fold = None` after one."""
    reads = (weight, bias, *scales, bn.running_mean, bn.running_var, bn.weight, bn.bias)
    key = (tuple(_version_key(t) for t in reads), float(bn.eps), kn_layout)
    hit = getattr(weight, "_kfuse_bn_fold", None)
    if hit is not None and hit[0] == key:
        return hit[1]
    # plain tensors even under inference_mode: cached_split keys the folded weight by its version counter
    with torch.inference_mode(False), torch.no_grad():
        folded = batch_norm_fold(weight.detach(), bias, tuple(scales), bn.running_mean, bn.running_var, bn.weight,
                                 bn.bias, float(bn.eps), kn_layout)
    weight._kfuse_bn_fold = (key, folded)
    return folded
