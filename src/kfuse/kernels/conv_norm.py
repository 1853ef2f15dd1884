"""BatchNorm2d/3d (and BatchNorm1d over (N, C, L)) after a convolution: statistics from per-tile partials, and the
eval-mode fold into the convolution's weight and bias (plain Triton + torch; pasted into generated files).

Training mode. A convolution's output tile is (output pixels, channels), so a channel's batch statistics (over N and
every spatial position) are a sum over row tiles, which no program sees whole. The region's first kernel stores, per
(row tile, channel), the tile's mean and M2 = sum((y - tile mean)^2), centred within the tile (no E[y^2] - E[y]^2
cancellation), in float64, and each tile's row count. Counts are explicit because a transposed convolution's tiles
belong to stride phases of different sizes (and a tile past its phase's rows counts 0), so "every tile full but the
last" (kernels/batchnorm.py's finalize) does not hold. `conv_bn_finalize_kernel` merges the tiles of each channel
(Chan et al.'s combination: mean = sum_t n_t mean_t / M, M2 = sum_t M2_t + n_t (mean_t - mean)^2) in float64 and
updates running_mean / running_var exactly as torch does (biased variance to normalize, unbiased M2 / (M - 1) into
running_var, running = (1 - momentum) running + momentum batch; num_batches_tracked is counted by the launcher,
kernels/batchnorm.py's batch_norm_momentum).
Bytes: 2 * 8 * tiles * C read, negligible next to the convolution (tiles = row tiles x phases).

Eval mode (`bn-eval-fold`): BatchNorm of conv(x, W) + b with running statistics is the convolution with
    W' = W * g (per output channel),  b' = (b - running_mean) * g + beta,  g = gamma / sqrt(running_var + eps),
exact in real arithmetic, computed in float64 and rounded once. A transposed convolution's weight is
(C_in, C_out / groups, k...): output channel g * C_out/groups + j is column j of group g's rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.kernels.gemm_core import cdiv
from kfuse.kernels.runtime import tensor_key


def conv_bn_stats_ref(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch reference: per-channel mean and biased variance of y (N, C, ...) over every other dim."""
    dims = [0, *range(2, y.dim())]
    return y.mean(dims), y.var(dims, unbiased=False)


# --- emitted below ---
@triton.jit
def conv_bn_finalize_kernel(mean_part_ptr, m2_part_ptr, count_ptr, mean_ptr, rstd_ptr, running_mean_ptr,
                            running_var_ptr, M, C, num_tiles, eps, momentum,
                            BLOCK_T: tl.constexpr, BLOCK: tl.constexpr, UPDATE: tl.constexpr):
    """BLOCK channels a program, BLOCK_T tiles a load: the (num_tiles, C) float64 partials and (num_tiles,) counts
    merged per channel in float64 (two passes: the centring needs the mean over all tiles), mean and 1/std stored
    in fp32; with UPDATE the running statistics too."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask_c = cols < C
    total = tl.zeros((BLOCK,), dtype=tl.float64)
    for t0 in range(0, num_tiles, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        mask = (t < num_tiles)[:, None] & mask_c[None, :]
        n_t = tl.load(count_ptr + t, mask=t < num_tiles, other=0.0).to(tl.float64)
        mean_t = tl.load(mean_part_ptr + t[:, None] * C + cols[None, :], mask=mask, other=0.0).to(tl.float64)
        total += tl.sum(n_t[:, None] * mean_t, axis=0)
    mean = total / M
    m2 = tl.zeros((BLOCK,), dtype=tl.float64)
    for t0 in range(0, num_tiles, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        mask = (t < num_tiles)[:, None] & mask_c[None, :]
        part = t[:, None] * C + cols[None, :]
        n_t = tl.load(count_ptr + t, mask=t < num_tiles, other=0.0).to(tl.float64)
        dev = tl.load(mean_part_ptr + part, mask=mask, other=0.0).to(tl.float64) - mean[None, :]
        m2_t = tl.load(m2_part_ptr + part, mask=mask, other=0.0).to(tl.float64)
        m2 += tl.sum(m2_t + n_t[:, None] * dev * dev, axis=0)
    var = m2 / M
    tl.store(mean_ptr + cols, mean.to(tl.float32), mask=mask_c)
    tl.store(rstd_ptr + cols, (1.0 / tl.sqrt(var + eps)).to(tl.float32), mask=mask_c)
    if UPDATE:
        rm = tl.load(running_mean_ptr + cols, mask=mask_c).to(tl.float64)
        rv = tl.load(running_var_ptr + cols, mask=mask_c).to(tl.float64)
        tl.store(running_mean_ptr + cols, (1.0 - momentum) * rm + momentum * mean, mask=mask_c)
        tl.store(running_var_ptr + cols, (1.0 - momentum) * rv + momentum * (m2 / (M - 1)), mask=mask_c)


def conv_bn_stats(mean_part: torch.Tensor, m2_part: torch.Tensor, counts: torch.Tensor, M: int, bn: torch.nn.Module,
                  factor: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and 1/sqrt(var + eps) from the (num_tiles, C) partials of M values per channel; with
    `factor` (the momentum, or 1/num_batches_tracked where momentum is None) also update bn's running statistics in
    place, as torch does."""
    num_tiles, C = mean_part.shape
    mean = torch.empty(C, device=mean_part.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    update = factor is not None
    rm = bn.running_mean if update else mean
    rv = bn.running_var if update else mean
    block = 32
    conv_bn_finalize_kernel[(cdiv(C, block),)](
        mean_part, m2_part, counts, mean, rstd, rm, rv, M, C, num_tiles, float(bn.eps), float(factor or 0.0),
        BLOCK_T=min(triton.next_power_of_2(num_tiles), 128), BLOCK=block, UPDATE=update)
    if update:  # written behind torch's back: bump the versions as an in-place torch op would (the fold's cache key)
        torch.autograd.graph.increment_version((bn.running_mean, bn.running_var))
    return mean, rstd


def conv_bn_fold(weight: torch.Tensor, bias: torch.Tensor | None, bn: torch.nn.Module, transposed: bool,
                 groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W', b') of eval-mode BatchNorm after conv(x, weight) + bias (module docstring), in float64, rounded once:
    W' to the weight's dtype, b' to fp32 or wider."""
    f64 = torch.float64
    g = (bn.running_var.to(f64) + float(bn.eps)).rsqrt()
    if bn.weight is not None:
        g = g * bn.weight.to(f64)
    w = weight.to(f64)
    if transposed:  # (C_in, C_out/groups, k...): channel (group, j) scales column j of the group's rows
        shape = w.shape
        w = (w.reshape(groups, shape[0] // groups, shape[1], -1) * g.reshape(groups, 1, shape[1], 1)).reshape(shape)
    else:
        w = w * g.reshape(-1, *([1] * (w.dim() - 1)))
    b = bn.running_mean.to(f64).neg() if bias is None else bias.to(f64).reshape(-1) - bn.running_mean.to(f64)
    b = b * g
    if bn.bias is not None:
        b = b + bn.bias.to(f64)
    return w.to(weight.dtype), b.to(torch.promote_types(weight.dtype, torch.float32)).contiguous()


def _version_key(t: torch.Tensor | None) -> tuple:
    return () if t is None else tensor_key(t)


def conv_bn_eval_fold(weight: torch.Tensor, bias: torch.Tensor | None, bn: torch.nn.Module, transposed: bool,
                      groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """conv_bn_fold's (W', b'), cached on the weight and reused while every tensor it reads (W, b, running_mean,
    running_var, gamma, beta) keeps its storage, version counter and shape and eps is the same: load_state_dict,
    an optimizer step, an in-place change and a training-mode call (conv_bn_stats bumps the running statistics'
    versions) recompute it. A write through `.data` bypasses version counters: set `weight._kfuse_conv_bn_fold =
    None` after one. W' is a Parameter without gradient so that the convolution's plan caches its split (or phase
    weight) on it as on any parameter: it is rebuilt only with the fold."""
    reads = (weight, bias, bn.running_mean, bn.running_var, bn.weight, bn.bias)
    key = (tuple(_version_key(t) for t in reads), float(bn.eps), transposed, groups)
    hit = getattr(weight, "_kfuse_conv_bn_fold", None)
    if hit is not None and hit[0] == key:
        return hit[1]
    with torch.inference_mode(False), torch.no_grad():
        w, b = conv_bn_fold(weight.detach(), None if bias is None else bias.detach(), bn, transposed, groups)
        folded = (torch.nn.Parameter(w, requires_grad=False), b)
    weight._kfuse_conv_bn_fold = (key, folded)
    return folded
