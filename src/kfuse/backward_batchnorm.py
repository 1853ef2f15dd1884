"""The fused backward of a GEMM + training-mode BatchNorm1d region (kind gemm_batchnorm): dZ in two or three
launches of one generated Triton kernel.

For z = x W^T + b -> pointwise ops -> BatchNorm1d (batch statistics) -> pointwise ops -> outputs, the norm's
statistics are per column over ALL M rows, which no program sees: the generated `<name>_dz_kernel` runs over
(rows x BLOCK_N) blocks, each looping over its row tiles (backward_epilogue.dz_kernel), up to three times
(constexpr PHASE; `batch_norm_passes` in kernels/backward_ops.py merges each phase's float64 (T, N) row-block
partials in torch between launches), all in float64 registers:
  PHASE 0  u = (ops before the norm)(z); per block and column the count, mean and centred sum of squares of u
           (each row tile's merged into the block's by Chan's formula) -> mean, rstd = 1 / sqrt(var + eps)
           (biased variance, torch's training-mode normalization);
  PHASE 1  xhat = (u - mean) * rstd; bn = xhat * gamma + beta; outputs = (ops after the norm)(bn); upstream
           gradients -> post-norm chain backward -> d_bn; per block and column sum d_bn and sum d_bn * xhat
           (beta's and gamma's gradients) -> their means m1, m2 over M. Where the norm is the region's last op,
           d_bn is the upstream gradient itself and PHASE 0 takes these sums too (no PHASE 1 launch);
  PHASE 2  all of it again, then du = rstd * gamma * (d_bn - m1 - xhat * m2) (torch's batch_norm backward),
           pre-norm chain backward -> dz, written in x's dtype, and per-block float64 column sums of dz (the
           Linear bias's gradient), d_gamma, d_beta and every other vector parameter's gradient, which
           `epilogue_dz` adds up, and the column maxima of |dz| (for dW's split of dZ^T).
Why recompute the statistics rather than take the forward's: the forward keeps fp32 statistics of its fp32 u;
the float64 torch backward (the reference) normalizes with float64 statistics of u recomputed from z, and the
gradients match it to float64 rounding only with those. Recomputing d_bn in PHASE 2 is cheaper than storing
an M x N float64 tile of it.
Bytes at fp32 for one output: z + dY (PHASE 0; z alone where PHASE 1 runs), z + dY (PHASE 1), z + dY read and dZ
written (PHASE 2): 20 bytes per element (seed 39), 24 with PHASE 1, plus small float64 partials (T = M / rows
per block, ~128 blocks). Seed 39 on the H100: 0.565 ms for the two launches (benchmarks/train/NOTES.md).

The pointwise parts are backward_epilogue.py's generator; this module adds the BatchNorm node's NodeRule.
A region whose ops are not all covered (an op without a derivative row, more than one norm) gets no kernel:
its Function keeps the float64 torch backward. Eval mode (running statistics) also keeps it:
FusedGemmFn.region_backward uses the fused dZ only where every BatchNorm of the region used batch statistics.
"""

from __future__ import annotations

from functools import partial

from kfuse.backward_epilogue import NodeRule, Operands, accumulate, dz_kernel, pointwise_ok
from kfuse.ir import Node, attr_expr
from kfuse.partition import Region
from kfuse.regions.common import var
from kfuse.regions.gemm_batchnorm import bn_params

# part_ptr: (2, T, N) float64 row-block partials of PHASE 0 and 1 ((4, T, N) merged); stat_ptr: (4, N) float64 mean, rstd, m1, m2
PHASE_ARGS = "part_ptr, stat_ptr, PHASE: tl.constexpr, "
# kernel variables of the norm (one per region): no value (v_<name>), parameter (p<i>), scalar (s<i>) or
# gradient (d_...) variable starts with bn_
XHAT, DOUT = "bn_xhat", "bn_dout"


def _stat(row: int) -> str:
    """Row `row` of stat (mean, rstd, m1, m2) for this program's columns, broadcast over the rows."""
    return f"tl.load(stat_ptr + {row} * N + offs_n, mask=mask_n, other=0.0)[None, :]"


def _store_partials(*values: str) -> list[str]:
    """This row block's column values into part[0, pid_m], part[1, pid_m], ..."""
    return [f"tl.store(part_ptr + ({j} * T + pid_m) * N + offs_n, {v}, mask=mask_n)" for j, v in enumerate(values)]


def batchnorm_dz_supported(region: Region) -> bool:
    """One BatchNorm (a module, one value input) over a 2-d GEMM output, every other op after the GEMM
    pointwise with a derivative row."""
    if region.kind != "gemm_batchnorm" or len(region.anchor.shape) != 2:
        return False
    n_cols = region.anchor.shape[-1]
    norms = [n for n in region.nodes[1:] if n.op == "batch_norm"]
    if len(norms) != 1 or not norms[0].module or len(norms[0].args) != 1 or not isinstance(norms[0].args[0], str):
        return False
    return all(n.op == "batch_norm" or pointwise_ok(n, n_cols) for n in region.nodes[1:])


def batchnorm_forward(n: Node, ops: Operands, env: dict[str, str], merged: bool = False) -> list[str]:
    """PHASE 0: the norm input's count, mean and centred sum of squares over the program's rows (each row tile's,
    merged into the running ones by Chan's formula); then the norm with the merged statistics (stat rows 0, 1).
    merged (the norm is the region's last op): PHASE 0 also takes PHASE 1's sums (see batchnorm_reverse)."""
    (x,) = n.args
    weight, bias, _eps = bn_params(n, n.shape[-1])
    out = var(n.name)
    ops.pre += ["bn_n = tl.zeros((BLOCK_N,), dtype=tl.float64)", "bn_mean = tl.zeros((BLOCK_N,), dtype=tl.float64)",
                "bn_m2 = tl.zeros((BLOCK_N,), dtype=tl.float64)",
                f"bn_smean = {_stat(0)}", f"bn_rstd = {_stat(1)}"]
    if not merged:
        ops.post += ["if PHASE == 0:", *[f"    {ln}" for ln in _store_partials("bn_mean", "bn_m2")]]
    # padding (past M or N) holds the ops' values at z = 0, which may not be finite (1 / z): zeros keep the
    # statistics and the column sums of d_bn * xhat (0 * inf) clean
    lines = [f"# BatchNorm ({n.origin}), batch statistics: PHASE 0 merges this tile's share (centred on its mean)",
             f"bn_u = tl.where(mask, {env[x]}, 0.0)",
             "if PHASE == 0:",
             "    bn_cnt = tl.sum(mask.to(tl.float64), axis=0)",
             "    bn_tmean = tl.sum(bn_u, axis=0) / tl.maximum(bn_cnt, 1.0)",
             "    bn_tdev = tl.where(mask, bn_u - bn_tmean[None, :], 0.0)",
             "    bn_delta = bn_tmean - bn_mean",
             "    bn_w = bn_cnt / tl.maximum(bn_n + bn_cnt, 1.0)",
             "    bn_mean = bn_mean + bn_delta * bn_w",
             "    bn_m2 = bn_m2 + tl.sum(bn_tdev * bn_tdev, axis=0) + bn_delta * bn_delta * bn_n * bn_w",
             "    bn_n = bn_n + bn_cnt",
             f"{XHAT} = (bn_u - bn_smean) * bn_rstd",
             f"{out} = {XHAT}"]
    if weight is not None:
        lines.append(f"{out} = {out} * {ops.name(weight, env)} + {ops.name(bias, env)}")
    env[n.name] = out
    return lines


def batchnorm_reverse(n: Node, ops: Operands, env: dict[str, str], grads: dict[str, str], rev: list[str],
                      merged: bool = False) -> None:
    """PHASE 1's column sums of d_bn and d_bn * xhat over the program's rows; gamma's and beta's gradient tiles
    (summed by the kernel's tail); du = rstd * gamma * (d_bn - m1 - xhat * m2) with m1, m2 their means over M
    (stat rows 2, 3).
    merged: d_bn is the upstream gradient itself (no op after the norm), so it needs no statistics and PHASE 0
    sums it too: S = sum d_bn and D = sum d_bn * (u - the block's mean), from each row tile's
    sum d_bn * (u - tile mean) + tile mean * sum d_bn (float64: the cancellation costs ~2^-53 |mean| / std).
    batch_norm_passes then gets sum d_bn * xhat = rstd * sum over blocks (D + (block mean - mean) S) without a
    PHASE 1 launch (one read of z and dY fewer)."""
    (x,) = n.args
    weight, bias, _eps = bn_params(n, n.shape[-1])
    ops.pre += ["bn_s1 = tl.zeros((BLOCK_N,), dtype=tl.float64)", "bn_s2 = tl.zeros((BLOCK_N,), dtype=tl.float64)",
                f"bn_m1 = {_stat(2)}", f"bn_m2s = {_stat(3)}"]
    # zeros outside the tile's valid part: padding rows must not reach the column sums
    rev.append(f"{DOUT} = tl.where(mask, {grads[var(n.name)]}, 0.0)  # backward of {n.origin}")
    if merged:
        ops.post += ["if PHASE == 0:", *[f"    {ln}" for ln in _store_partials(
            "bn_mean", "bn_m2", "bn_s1", "bn_s2 - bn_mean * bn_s1")]]
        rev += ["if PHASE == 0:",
                f"    bn_sd = tl.sum({DOUT}, axis=0)",
                "    bn_s1 = bn_s1 + bn_sd",
                f"    bn_s2 = bn_s2 + tl.sum({DOUT} * bn_tdev, axis=0) + bn_tmean * bn_sd"]
    else:
        ops.post += ["if PHASE == 1:", *[f"    {ln}" for ln in _store_partials("bn_s1", "bn_s2")]]
        rev += ["if PHASE == 1:",
                f"    bn_s1 = bn_s1 + tl.sum({DOUT}, axis=0)",
                f"    bn_s2 = bn_s2 + tl.sum({DOUT} * {XHAT}, axis=0)"]
    if weight is not None:
        accumulate(grads, ops.name(weight, env), f"{DOUT} * {XHAT}", rev)
        accumulate(grads, ops.name(bias, env), DOUT, rev)
    scale = f"bn_rstd * {ops.name(weight, env)}" if weight is not None else "bn_rstd"
    accumulate(grads, env[x], f"{scale} * ({DOUT} - bn_m1 - {XHAT} * bn_m2s)", rev)


def batchnorm_rule(region: Region) -> NodeRule:
    """The norm's NodeRule; merged statistics passes where the norm is the region's last op."""
    merged = region.nodes[-1].op == "batch_norm"
    return NodeRule(partial(batchnorm_forward, merged=merged), partial(batchnorm_reverse, merged=merged))


def batchnorm_dz_kernel(region: Region, name: str) -> tuple[str, list[str], list[str], str]:
    """(kernel source, parameter and scalar expressions in kernel order, the extra epilogue_dz argument that
    runs the statistics phases with the norm's eps)."""
    src, params, scalars = dz_kernel(region, name, {"batch_norm": batchnorm_rule(region)}, PHASE_ARGS, "PHASE == 2")
    norm = next(n for n in region.nodes if n.op == "batch_norm")
    merged = ", bn_merged=True" if region.nodes[-1] is norm else ""
    return src, params, scalars, f", bn_eps=float({attr_expr(norm.module)}.eps){merged}"
