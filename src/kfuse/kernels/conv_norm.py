"""BatchNorm2d/3d (and BatchNorm1d over (N, C, L)) after a convolution: statistics from per-tile partials, and the
eval-mode fold into the convolution's weight and bias (plain Triton + torch; pasted into generated files).

Training mode. A convolution's output tile is (output pixels, channels), so a channel's batch statistics (over N and
every spatial position) are a sum over row tiles, which no program sees whole. The region's first kernel stores, per
(row tile, channel), the tile's mean and M2 = sum((y - tile mean)^2), centred within the tile (no E[y^2] - E[y]^2
cancellation), in float64, and each tile's row count. Counts are explicit because a transposed convolution's tiles
belong to stride phases of different sizes (and a tile past its phase's rows counts 0), so "every tile full but the
last" does not hold: kernels/batchnorm.py's finalize reads each tile's count (`batch_norm_stats` given the counts
tensor) and merges the tiles of each channel (Chan et al.'s combination: mean = sum_t n_t mean_t / M,
M2 = sum_t M2_t + n_t (mean_t - mean)^2) in float64 and
updates running_mean / running_var exactly as torch does (biased variance to normalize, unbiased M2 / (M - 1) into
running_var, running = (1 - momentum) running + momentum batch; num_batches_tracked is counted by the launcher,
kernels/batchnorm.py's batch_norm_momentum).
Bytes: 2 * 8 * tiles * C read, negligible next to the convolution (tiles = row tiles x phases).

GroupNorm and InstanceNorm (= GroupNorm with one channel a group) after a convolution (its region kind).
Statistics are per (sample, group) over the group's channels x every spatial position. A row tile of the convolution
(rows = n * S + s, S output pixels a sample, or a stride phase's pixels) may hold the end of one sample and the start
of the next, so the tile's partials are segmented by sample: for each sample the tile holds (at most `slots`), its
rows' per-channel mean and centred M2 in float64 and their count, stored under entry (sample, phase, j), j = the
tile's index among the tiles touching that sample (at most J). Entries no tile wrote keep count 0 (the buffers start
at zero), so the merge needs no geometry: `conv_gn_channel_kernel` merges each (sample, channel)'s entries, then
`conv_gn_group_kernel` each (sample, group)'s channels (equal counts), both Chan's combination in float64 with two
passes: groups of any width, samples of any size.
Bytes: 2 * 8 * N * E * C read (E = phases * J entries a sample), negligible next to the convolution.

LayerNorm over trailing dims after a convolution (its region kind): statistics per normalized row, the last L =
prod(normalized_shape) elements of NC(D)HW memory (a row of W pixels of one channel for normalized_shape (W,), a
whole sample for (C, D, H, W)), so row r is the contiguous y[r * L : (r + 1) * L]. `conv_ln_moments_kernel` reads
each row in BLOCK_L chunks (any L): each chunk's fp32 mean and centred M2, merged into the row's in float64 (Chan's
combination), then mean and 1/sqrt(var + eps) in fp32. Bytes: y read once (4 bytes an element), 8 bytes a row
written. A softmax or log_softmax over such rows (the last dim of a view that flattens trailing dims, or W itself):
`conv_softmax_stats_kernel`, each row's max and sum of exp(y - max) over its chunks (the running sum rescaled when
the max grows, in float64).

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
from kfuse.kernels.runtime import interpreting, tensor_key


def conv_bn_stats_ref(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch reference: per-channel mean and biased variance of y (N, C, ...) over every other dim."""
    dims = [0, *range(2, y.dim())]
    return y.mean(dims), y.var(dims, unbiased=False)


def conv_ln_moments_ref(y: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch reference: mean and biased variance of each contiguous row of `length` elements of y."""
    rows = y.reshape(-1, length)
    return rows.mean(1), rows.var(1, unbiased=False)


def conv_softmax_stats_ref(y: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch reference: each contiguous row's max and sum of exp(y - max)."""
    rows = y.reshape(-1, length)
    top = rows.amax(1)
    return top, (rows - top[:, None]).exp().sum(1)


def conv_gn_stats_ref(y: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch reference: (N, groups) mean and biased variance of y (N, C, ...), each over a group's channels
    and every spatial position."""
    flat = y.reshape(y.shape[0], groups, -1)
    return flat.mean(2), flat.var(2, unbiased=False)


# --- emitted below ---
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
    an optimizer step, an in-place change and a training-mode call (batch_norm_stats bumps the running statistics'
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


def conv_gn_layout(geo, block_m: int) -> tuple[int, int, int]:
    """(phases, J, slots) of the GroupNorm partials of a convolution (ConvGeometry) or a transposed one
    (TransposedGeometry, one row space per stride phase) tiled in `block_m` rows: J bounds the row tiles touching
    one sample's S rows (cdiv(S - 1, block_m) + 1, S of the largest phase), slots the samples one tile touches
    (cdiv(block_m - 1, S) + 1, S of the smallest phase that has pixels; at most N)."""
    n = geo.out_shape[0]
    phases = getattr(geo, "n_phases", 1)
    s_max = max(geo.M // max(n, 1), 1)
    s_min = s_max
    if hasattr(geo, "n_phases"):  # a phase's pixels per dim: ceil((O - r) / stride), at least floor(O / stride)
        s_min = 1
        for o, st in ((geo.OD, geo.SD), (geo.OH, geo.SH), (geo.OW, geo.SW)):
            s_min *= max(o // st, 1)
    return phases, cdiv(s_max - 1, block_m) + 1, min(n, cdiv(block_m - 1, s_min) + 1)


@triton.jit
def conv_gn_channel_kernel(mean_part_ptr, m2_part_ptr, count_ptr, ch_mean_ptr, ch_m2_ptr, C, E,
                           BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
    """Stage 1 of the GroupNorm merge, one program per (sample n, BLOCK_C channels): the (N, E, C) float64 partials
    of n's E entries merged per channel (Chan's combination, two passes: the centring needs the channel's mean) into
    (N, C) float64 mean and M2. Entries with count 0 (no tile wrote them) add nothing."""
    n = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = cols < C
    base = n.to(tl.int64) * E
    rows = tl.zeros((BLOCK_E,), dtype=tl.float64)
    total = tl.zeros((BLOCK_C,), dtype=tl.float64)
    for e0 in range(0, E, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        n_e = tl.load(count_ptr + base + e, mask=e < E, other=0.0).to(tl.float64)
        rows += n_e
        at = (base + e)[:, None] * C + cols[None, :]
        mean_t = tl.load(mean_part_ptr + at, mask=(e < E)[:, None] & mask_c[None, :], other=0.0).to(tl.float64)
        total += tl.sum(n_e[:, None] * mean_t, axis=0)
    mean = total / tl.maximum(tl.sum(rows, axis=0), 1.0)
    m2 = tl.zeros((BLOCK_C,), dtype=tl.float64)
    for e0 in range(0, E, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        mask = (e < E)[:, None] & mask_c[None, :]
        n_e = tl.load(count_ptr + base + e, mask=e < E, other=0.0).to(tl.float64)
        at = (base + e)[:, None] * C + cols[None, :]
        dev = tl.load(mean_part_ptr + at, mask=mask, other=0.0).to(tl.float64) - mean[None, :]
        m2_t = tl.load(m2_part_ptr + at, mask=mask, other=0.0).to(tl.float64)
        m2 += tl.sum(tl.where(mask, m2_t + n_e[:, None] * dev * dev, 0.0), axis=0)
    tl.store(ch_mean_ptr + n.to(tl.int64) * C + cols, mean, mask=mask_c)
    tl.store(ch_m2_ptr + n.to(tl.int64) * C + cols, m2, mask=mask_c)


@triton.jit
def conv_gn_group_kernel(ch_mean_ptr, ch_m2_ptr, count_ptr, mean_ptr, rstd_ptr, C, E, GROUP, NUM_GROUPS, eps,
                         BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_J: tl.constexpr):
    """Stage 2, one program per (sample n, BLOCK_G groups): each group's GROUP channels merged from stage 1's
    per-channel mean and M2 (every channel of a sample has the same count, the sample's rows), in float64; mean and
    1/sqrt(var + eps) stored in fp32 at (n, group)."""
    n = tl.program_id(0)
    gs = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    mask_g = gs < NUM_GROUPS
    base = n.to(tl.int64) * E
    rows = tl.zeros((BLOCK_E,), dtype=tl.float64)
    for e0 in range(0, E, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        rows += tl.load(count_ptr + base + e, mask=e < E, other=0.0).to(tl.float64)
    per_channel = tl.sum(rows, axis=0)
    total = tl.zeros((BLOCK_G,), dtype=tl.float64)
    for j0 in range(0, GROUP, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        mask = mask_g[:, None] & (j < GROUP)[None, :]
        at = n.to(tl.int64) * C + gs[:, None] * GROUP + j[None, :]
        total += tl.sum(tl.load(ch_mean_ptr + at, mask=mask, other=0.0), axis=1)
    mean = total / GROUP
    m2 = tl.zeros((BLOCK_G,), dtype=tl.float64)
    for j0 in range(0, GROUP, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        mask = mask_g[:, None] & (j < GROUP)[None, :]
        at = n.to(tl.int64) * C + gs[:, None] * GROUP + j[None, :]
        dev = tl.load(ch_mean_ptr + at, mask=mask, other=0.0) - mean[:, None]
        m2_c = tl.load(ch_m2_ptr + at, mask=mask, other=0.0)
        m2 += tl.sum(tl.where(mask, m2_c + per_channel * dev * dev, 0.0), axis=1)
    var = m2 / (per_channel * GROUP)
    out = n * NUM_GROUPS + gs
    tl.store(mean_ptr + out, mean.to(tl.float32), mask=mask_g)
    tl.store(rstd_ptr + out, (1.0 / tl.sqrt(var + eps)).to(tl.float32), mask=mask_g)


def conv_gn_stats(mean_part: torch.Tensor, m2_part: torch.Tensor, counts: torch.Tensor, groups: int,
                  eps: float, channel_means: bool = False) -> tuple[torch.Tensor, ...]:
    """(N, groups) mean and 1/sqrt(var + eps) (fp32) from the (N, E, C) partials and (N, E) counts of the
    GroupNorm stats kernel (conv_gn_layout's entries), C channels in `groups` groups of C // groups: per channel
    first (conv_gn_channel_kernel), then per group (conv_gn_group_kernel). Two small launches rather than one
    program per (sample, group): the interpreter's cost is per program, and InstanceNorm has a group per channel.
    With `channel_means`: (N, C) float64 channel means, (N, groups) float64 group means and the fp32 1/std, what
    a mean of the normalized values over the spatial dims needs: (channel mean - group mean) * rstd."""
    n, e, c = mean_part.shape
    mean = torch.empty((n, groups), device=mean_part.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    ch_mean = torch.empty((n, c), device=mean_part.device, dtype=torch.float64)
    if not n:
        return (ch_mean, mean.double(), rstd) if channel_means else (mean, rstd)
    ch_m2 = torch.empty_like(ch_mean)
    block_e = min(triton.next_power_of_2(e), 32)
    conv_gn_channel_kernel[(n, cdiv(c, 64))](mean_part, m2_part, counts, ch_mean, ch_m2, c, e,
                                            BLOCK_E=block_e, BLOCK_C=64)
    group = c // groups
    block_g = min(triton.next_power_of_2(groups), 64)
    conv_gn_group_kernel[(n, cdiv(groups, block_g))](ch_mean, ch_m2, counts, mean, rstd, c, e, group, groups,
                                                     float(eps), BLOCK_E=block_e, BLOCK_G=block_g,
                                                     BLOCK_J=min(triton.next_power_of_2(group), 64))
    if channel_means:  # every channel has as many pixels: the group's mean is its channels' mean
        return ch_mean, ch_mean.view(n, groups, group).mean(2), rstd
    return mean, rstd


@triton.jit
def conv_ln_moments_kernel(y_ptr, a_ptr, b_ptr, R, L, SEG, eps, BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr,
                           SPLIT: tl.constexpr):
    """Mean and 1/sqrt(var + eps) (fp32) of BLOCK_R contiguous rows of L elements of y: each BLOCK_L chunk's mean and
    centred M2 in fp32, merged into the row's in float64. SPLIT: the program covers segment program_id(1) of SEG
    elements of each row and stores its float64 mean and M2 at (row, segment) of a and b (merged by row_stats)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = rows < R
    base = rows.to(tl.int64) * L
    lo = tl.program_id(1) * SEG
    hi = tl.minimum(lo + SEG, L)
    count = tl.zeros((BLOCK_R,), dtype=tl.float64)
    mean = tl.zeros((BLOCK_R,), dtype=tl.float64)
    m2 = tl.zeros((BLOCK_R,), dtype=tl.float64)
    for l0 in range(lo, hi, BLOCK_L):
        cols = l0 + tl.arange(0, BLOCK_L)
        mask = mask_r[:, None] & (cols < hi)[None, :]
        y = tl.load(y_ptr + base[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        n_c = tl.minimum(hi - l0, BLOCK_L).to(tl.float32)
        c_mean = tl.sum(y, axis=1) / n_c
        dev = tl.where(mask, y - c_mean[:, None], 0.0)
        c_m2 = tl.sum(dev * dev, axis=1)
        total = count + n_c
        delta = c_mean.to(tl.float64) - mean
        mean += delta * n_c / total
        m2 += c_m2.to(tl.float64) + delta * delta * count * n_c / total
        count = total
    if SPLIT:
        at = rows.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        tl.store(a_ptr + at, mean, mask=mask_r)
        tl.store(b_ptr + at, m2, mask=mask_r)
    else:
        tl.store(a_ptr + rows, mean.to(tl.float32), mask=mask_r)
        tl.store(b_ptr + rows, (1.0 / tl.sqrt(m2 / L + eps)).to(tl.float32), mask=mask_r)


def merge_moments(mean: torch.Tensor, m2: torch.Tensor, counts: torch.Tensor, length: int,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, 1/sqrt(var + eps)), fp32, of rows from their segments' float64 (rows, segments) means and M2 and the
    segments' (segments,) counts (Chan's combination)."""
    row_mean = (mean * counts).sum(1) / length
    row_m2 = m2.sum(1) + ((mean - row_mean[:, None]) ** 2 * counts).sum(1)
    return row_mean.float(), (row_m2 / length + eps).rsqrt().float()


def conv_ln_moments(y: torch.Tensor, length: int, eps: float, segments: int | None = None) -> tuple[torch.Tensor,
                                                                                                      torch.Tensor]:
    """(mean, 1/sqrt(var + eps)), fp32, of each contiguous row of `length` elements of y (conv_ln_moments_kernel).
    `segments`: how many programs share a row (default: row_plan's)."""
    return row_stats(conv_ln_moments_kernel, merge_moments, y, length, segments, float(eps))


@triton.jit
def conv_softmax_stats_kernel(y_ptr, a_ptr, b_ptr, R, L, SEG, BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr,
                              SPLIT: tl.constexpr):
    """Max and sum of exp(y - max) of BLOCK_R contiguous rows of L elements of y, chunk by chunk: a chunk's exps
    summed in fp32, the running sum (float64) rescaled by exp(old max - new max) when the max grows. SPLIT: the
    program covers segment program_id(1) of SEG elements of each row and stores its max and float64 sum at (row,
    segment) of a and b (merged by row_stats)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = rows < R
    base = rows.to(tl.int64) * L
    lo = tl.program_id(1) * SEG
    hi = tl.minimum(lo + SEG, L)
    top = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_R,), dtype=tl.float64)
    for l0 in range(lo, hi, BLOCK_L):
        cols = l0 + tl.arange(0, BLOCK_L)
        mask = mask_r[:, None] & (cols < hi)[None, :]
        y = tl.load(y_ptr + base[:, None] + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        new_top = tl.maximum(top, tl.max(y, axis=1))
        safe = tl.where(new_top == float("-inf"), 0.0, new_top)  # a row of -inf so far: nothing to rescale
        chunk = tl.sum(tl.where(mask, tl.exp(y - safe[:, None]), 0.0), axis=1)
        total = total * tl.exp(top - safe).to(tl.float64) + chunk.to(tl.float64)
        top = new_top
    if SPLIT:
        at = rows.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        tl.store(a_ptr + at, top.to(tl.float64), mask=mask_r)
        tl.store(b_ptr + at, total, mask=mask_r)
    else:
        tl.store(a_ptr + rows, top, mask=mask_r)
        tl.store(b_ptr + rows, total.to(tl.float32), mask=mask_r)


def merge_softmax(top: torch.Tensor, total: torch.Tensor, counts: torch.Tensor, length: int) -> tuple[torch.Tensor,
                                                                                                      torch.Tensor]:
    """(max, sum of exp(y - max)), fp32, of rows from their segments' (rows, segments) maxima and float64 sums."""
    row_top = top.amax(1)
    safe = torch.where(row_top == float("-inf"), 0.0, row_top)
    scale = torch.where(top == float("-inf"), 0.0, (top - safe[:, None]).exp())  # an empty or all -inf segment
    return row_top.float(), (total * scale).sum(1).float()


def conv_softmax_stats(y: torch.Tensor, length: int, segments: int | None = None) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
    """(max, sum of exp(y - max)), fp32, of each contiguous row of `length` elements of y. `segments`: how many
    programs share a row (default: row_plan's)."""
    return row_stats(conv_softmax_stats_kernel, merge_softmax, y, length, segments)


# programs a row-statistics launch aims for on a GPU: with few long rows (a softmax over each channel's pixels,
# KernelBench level 2 38: 2048 rows of 131072) one program a row block left most SMs idle (8 ms for 1 GiB of y)
ROW_PROGRAMS = 2048


def row_plan(length: int, rows: int, segments: int | None = None) -> tuple[int, int, int]:
    """(rows, chunk width, segment length) a program of the row statistics takes. On a GPU: 64-wide chunks of up to
    4096 elements a step for short rows, 4 rows of 1024-wide chunks for rows of 1024 or more (contiguous loads);
    each row split into segments until about ROW_PROGRAMS programs run. In the interpreter, whose cost is per
    program and per op: wider chunks and one segment. `segments` overrides the count (tests)."""
    wide = length >= 1024 and not interpreting()
    block_l = 1024 if wide else min(triton.next_power_of_2(max(length, 1)), 1024 if interpreting() else 64)
    step = 16384 if interpreting() else 4096
    block_r = max(min(triton.next_power_of_2(max(rows, 1)), step // block_l), 1)
    if segments is None:
        chunks = cdiv(max(length, 1), block_l)
        segments = 1 if interpreting() else max(1, min(chunks, ROW_PROGRAMS // max(cdiv(rows, block_r), 1)))
    seg = cdiv(cdiv(max(length, 1), max(segments, 1)), block_l) * block_l
    return block_r, block_l, seg


def row_stats(kernel, merge, y: torch.Tensor, length: int, segments: int | None,
              *scalars: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Two fp32 statistics per contiguous row of `length` elements of y, by one of the row kernels above (its
    arguments: y, the two outputs, rows, length, the segment length, `scalars`), row_plan's rows, chunk and segment
    a program; with more than one segment a row, the kernel's float64 partials per (row, segment) and `merge`."""
    rows = y.numel() // max(length, 1)
    block_r, block_l, seg = row_plan(length, rows, segments)
    n_seg = cdiv(max(length, 1), seg)
    if n_seg == 1 or not rows:
        a = torch.empty((rows,), device=y.device, dtype=torch.float32)
        b = torch.empty_like(a)
        if rows:
            kernel[(cdiv(rows, block_r), 1)](y, a, b, rows, length, seg, *scalars, BLOCK_R=block_r,
                                             BLOCK_L=block_l, SPLIT=False)
        return a, b
    a = torch.empty((rows, n_seg), device=y.device, dtype=torch.float64)
    b = torch.empty_like(a)
    kernel[(cdiv(rows, block_r), n_seg)](y, a, b, rows, length, seg, *scalars, BLOCK_R=block_r, BLOCK_L=block_l,
                                         SPLIT=True)
    counts = (length - torch.arange(n_seg, device=y.device, dtype=torch.float64) * seg).clamp(max=seg)
    return merge(a, b, counts, length, *scalars)
