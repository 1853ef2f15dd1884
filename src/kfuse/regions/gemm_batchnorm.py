"""Region kind `gemm_batchnorm`: GEMM -> pointwise ops -> BatchNorm1d -> pointwise ops.

Training mode (or no running statistics) needs each column's mean and variance over ALL rows, which no
single tile sees. Three launches:
  1. `<name>_stats_kernel`: the GEMM and the ops before the norm; stores y (the norm's input) and, per
     (row tile, column), the tile's mean and M2 (centred sum of squares) — see kernels/batchnorm.py;
  2. `batch_norm_finalize_kernel`: merges the tiles per column (Chan's combination, float64), writes mean and 1/std and
     updates running_mean / running_var in place (num_batches_tracked is counted by the launcher);
  3. `<name>_apply_kernel`: one pass over y: (y - mean) * rstd * weight + bias, then the ops after the norm.
Bytes beyond the GEMM: y written once and read once (2 * M * N * 4), the output written once. A training
forward that keeps z for backward (fp32, y read by nothing outside) writes z alone and apply recomputes y from
it (constexprs STORE_Y, FROM_Z): z is written anyway, so y's write is saved.
Eval mode: the running statistics are per-column constants. Where the ops between the GEMM and the norm are
multiplications by per-feature parameters and nothing outside reads a value before the norm (`fold_plan`),
the norm is folded into the weights (rule `bn-eval-fold`): the launcher asks `bn_eval_fold`
(kernels/batchnorm.py) for W' and b', computed in float64 and cached until anything they are made of changes,
and runs one plain GEMM kernel (`<name>_folded_kernel`) with b' and the ops after the norm as its epilogue.
Otherwise the norm is one more epilogue line of one kernel (`<name>_eval_kernel`). The fold cannot be done
when kfuse runs: the mode and the running statistics are read when ModelNew is called, as torch does.

Backward (training mode): dZ in two or three launches of one generated Triton kernel.

For z = x W^T + b -> pointwise ops -> BatchNorm1d (batch statistics) -> pointwise ops -> outputs, the norm's
statistics are per column over ALL M rows, which no program sees: the generated `<name>_dz_kernel` runs over
(rows x BLOCK_N) blocks, each looping over its row tiles (pointwise_dz.dz_kernel), up to three times
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

The pointwise parts are regions/pointwise_dz.py's generator; this module adds the BatchNorm node's NodeRule.
A region whose ops are not all covered (an op without a derivative row, more than one norm) gets no kernel:
its Function keeps the float64 torch backward. Eval mode (running statistics) also keeps it:
FusedGemmFn.region_backward uses the fused dZ only where every BatchNorm of the region used batch statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from kfuse.ir import Graph, Node, Param, Region, attr_expr
from kfuse.regions.common import (
    KEPT,
    SAVE_Z_DOC,
    KernelArgs,
    RegionCode,
    bn_normalize,
    bn_params,
    call,
    constexpr,
    forward_calls,
    gemm_cost,
    gemm_head,
    gemm_kernel,
    gemm_launch,
    is_column_vector,
    is_single,
    launcher,
    linear_bias,
    operand_code,
    plain,
    pointwise_kernel,
    pointwise_lines,
    store_line,
    tuned_launch_lines,
    var,
)
from kfuse.regions.kind import EpilogueKind, Walk, norm_of_tile
from kfuse.regions.pointwise_dz import NodeRule, Operands, accumulate, dz_kernel, pointwise_ok

FOLD_RULE = "bn-eval-fold"


@dataclass(frozen=True)
class FoldPlan:
    """What eval mode folds into the GEMM: its bias (None without one) and the per-feature scale parameters
    between the GEMM and the BatchNorm, in order."""

    bias: Param | None
    scales: tuple[Param, ...]
    kn: bool  # x @ W with W (K, N): features are W's columns


def _scale_operand(n: Node, prev: str, n_cols: int) -> Param | None:
    """The parameter of `prev * p` (or `p * prev`) when p is a per-feature or 1-element vector, else None."""
    if n.op != "mul" or len(n.args) != 2 or prev not in n.args:
        return None
    other = n.args[1] if n.args[0] == prev else n.args[0]
    ok = isinstance(other, Param) and (is_column_vector(other, n_cols) or is_single(other))
    return other if ok else None


def fold_plan(region: Region) -> FoldPlan | None:
    """Can eval mode fold the BatchNorm into W and b? Only where that is exact and loses no value: the norm has
    running statistics, every op before it is a multiplication of the previous value by a per-feature (or
    1-element) parameter, and no value before the norm is read outside the region (the fold never forms it)."""
    anchor = region.anchor
    at = next(i for i, n in enumerate(region.nodes) if n.op == "batch_norm")
    bn, n_cols = region.nodes[at], anchor.shape[-1]
    if not bn.attrs.get("track_running_stats", True) or any(n.name in region.outputs for n in region.nodes[:at]):
        return None
    if anchor.op not in ("linear", "matmul") or not isinstance(anchor.args[1], Param) or len(anchor.args[1].shape) != 2:
        return None
    bias = anchor.args[2] if anchor.op == "linear" and len(anchor.args) > 2 else None
    if bias is not None and not (isinstance(bias, Param) and is_column_vector(bias, n_cols)):
        return None
    scales, prev = [], anchor.name
    for n in region.nodes[1:at]:
        p = _scale_operand(n, prev, n_cols)
        if p is None:
            return None
        scales.append(p)
        prev = n.name
    if bn.args[0] != prev:
        return None
    return FoldPlan(bias, tuple(scales), anchor.op == "matmul")

STATS_LINES = (
    "# per-column partial statistics of this row tile, centred on the tile's own mean",
    "t_count = tl.minimum(M - pid_m * BLOCK_M, BLOCK_M).to(tl.float32)",
    "t_mean = tl.sum(tl.where(mask, {y}, 0.0), axis=0) / t_count",
    "t_dev = tl.where(mask, {y} - t_mean[None, :], 0.0)",
    "tl.store(mean_part_ptr + pid_m * N + offs_n, t_mean, mask=mask_n)",
    "tl.store(m2_part_ptr + pid_m * N + offs_n, tl.sum(t_dev * t_dev, axis=0), mask=mask_n)",
)




def _stores(values: list[str], env: dict[str, str]) -> list[str]:
    return [store_line(f"buf_{v}", env[v]) for v in values]


def _eval_kernel(region: Region, name: str, cost: str, bn: Node, before: list[Node], after: list[Node],
                 pre_outs: list[str], post_outs: list[str],
                 registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Eval mode as one GEMM kernel: (y - running_mean) / sqrt(running_var + eps) * weight + bias."""
    path, n_cols, y = bn.module, region.anchor.shape[-1], bn.args[0]
    w, b, eps = bn_params(bn, n_cols)
    args, env = KernelArgs(registry), {}
    body = linear_bias(region.anchor, env, args) + pointwise_lines(before, env, args) + _stores(pre_outs, env)
    rm = args.operand(Param(f"{path}.running_mean", (n_cols,)), env)
    rv = args.operand(Param(f"{path}.running_var", (n_cols,)), env)
    body += bn_normalize(var(bn.name), f"({env[y]} - {rm})", f"(1.0 / tl.sqrt({rv} + {args.operand(eps, env)}))",
                       w, b, env, args)
    env[bn.name] = var(bn.name)
    body += pointwise_lines(after, env, args) + _stores(post_outs, env)
    replaced = ", ".join(n.origin for n in region.nodes)
    kernel = gemm_kernel(f"{name}_eval", f"Eval mode (running statistics): {replaced}.",
                         [f"buf_{v}" for v in pre_outs + post_outs], args, body, cost=cost)
    return kernel, args


def _folded_kernel(region: Region, name: str, cost: str, bn: Node, after: list[Node], outs: list[str],
                   registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Eval mode with the norm folded into W' and b' (bn_eval_fold): acc + b', then the ops after the norm."""
    args, env = KernelArgs(registry), {}
    folded = ", ".join(n.origin for n in region.nodes[:region.nodes.index(bn) + 1])
    body = ["fold_b = tl.load(fold_b_ptr + offs_n, mask=mask_n, other=0.0)[None, :]",
            f"{var(bn.name)} = acc + fold_b  # {folded}, folded into W' and b'"]
    env[bn.name] = var(bn.name)
    body += pointwise_lines(after, env, args) + _stores(outs, env)
    replaced = ", ".join(n.origin for n in region.nodes)
    kernel = gemm_kernel(f"{name}_folded", f"Eval mode, BatchNorm folded into the weights ({FOLD_RULE}): {replaced}.",
                         [f"buf_{v}" for v in outs] + ["fold_b"], args, body, cost=cost)
    return kernel, args


def _fold_call(plan: FoldPlan, registry: dict[str, tuple[str, bool]]) -> str:
    """Launcher line: W' and b' for this call's running statistics, from the launcher's own parameters
    (the bias and scales are registered by the stats kernel, which reads them too)."""
    def name(p: Param) -> str:
        return registry[f"as_vector({p.expr()})"][0]
    bias = name(plan.bias) if plan.bias is not None else "None"
    scales = "".join(f"{name(p)}, " for p in plan.scales)
    return f"weight, fold_b = bn_eval_fold(weight, {bias}, ({scales}), bn, {plan.kn})  # the GEMM below reads W'"


def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    name = stem
    at = next(i for i, n in enumerate(region.nodes) if n.op == "batch_norm")
    bn = region.nodes[at]
    n_cols = region.anchor.shape[-1]
    w, b, eps = bn_params(bn, n_cols)
    before, after = list(region.nodes[1:at]), list(region.nodes[at + 1:])
    pre_names = {n.name for n in region.nodes[:at]}
    pre_outs = [v for v in region.outputs if v in pre_names]
    post_outs = [v for v in region.outputs if v not in pre_names]
    y = bn.args[0]
    registry: dict[str, tuple[str, bool]] = {}
    replaced = ", ".join(n.origin for n in region.nodes)

    # y (the norm's input) can come back from z where nothing outside reads it: a training forward that keeps z
    # for backward (fp32: z holds the GEMM's values exactly) then writes z alone, and apply runs the ops before
    # the norm again (one M x N write fewer in the GEMM's epilogue)
    from_z_ok = y not in pre_outs

    # 1. GEMM + ops before the norm, y and the per-tile partials
    a1, env1 = KernelArgs(registry), {}
    body1 = linear_bias(region.anchor, env1, a1) + pointwise_lines(before, env1, a1)
    stats_outs = list(dict.fromkeys([y, *pre_outs]))
    store_y, *store_rest = _stores(stats_outs, env1)
    body1 += ["if STORE_Y:", f"    {store_y}", *store_rest] + [ln.format(y=env1[y]) for ln in STATS_LINES]
    stats = gemm_kernel(f"{name}_stats", f"Training-mode pass 1 of: {replaced}.",
                        [f"buf_{v}" for v in stats_outs] + ["mean_part", "m2_part"], a1, body1,
                        extra_sig=(constexpr("STORE_Y"),), z_var=var(region.anchor.name), cost=gemm_cost(region, g))

    # 3. apply: normalize y with the batch statistics, then the ops after the norm
    a3, env3 = KernelArgs(registry), {y: "v_y"}
    env_z = {region.anchor.name: var(region.anchor.name)}
    again = pointwise_lines(before, env_z, a3)
    body3 = ["if FROM_Z:  # y_ptr holds z: the ops before the norm again, as the stats kernel ran them",
             f"    {var(region.anchor.name)} = v_y", *[f"    {ln}" for ln in again], f"    v_y = {env_z[y]}"]
    body3 += bn_normalize(var(bn.name), "(v_y - mean)", "rstd", w, b, env3, a3)
    a3.loads += ["mean = tl.load(mean_ptr + offs_n, mask=mask_n, other=0.0)[None, :]",
                 "rstd = tl.load(rstd_ptr + offs_n, mask=mask_n, other=1.0)[None, :]"]
    env3[bn.name] = var(bn.name)
    body3 += pointwise_lines(after, env3, a3) + _stores(post_outs, env3)
    # mean and rstd are (N,) vectors (loaded above), not tiles: pointers after y that pointwise_kernel leaves alone
    apply = pointwise_kernel(f"{name}_apply", f"Training-mode pass 3 of: {replaced}.", ["y"],
                             ["mean", "rstd", *[f"buf_{v}" for v in post_outs]], a3, body3,
                             extra_sig=(constexpr("FROM_Z"),))

    # eval: the norm folded into W and b where fold_plan allows, else one kernel with the running statistics
    # as per-column constants (neither without running statistics)
    plan = fold_plan(region)
    has_running = bn.attrs.get("track_running_stats", True)
    if plan is not None:
        evalk = _folded_kernel(region, name, gemm_cost(region, g), bn, after, post_outs, registry)
    elif has_running:
        evalk = _eval_kernel(region, name, gemm_cost(region, g), bn, before, after, pre_outs, post_outs, registry)
    else:
        evalk = None
    a2 = evalk[1] if evalk else None

    def launch(kernel: str, outs: list[str], args: KernelArgs, extra: tuple[str, ...] = (),
               kw: tuple[str, ...] = ()) -> str:
        return gemm_launch(kernel, ["*ops", *[f"buf_{v}" for v in outs], *extra, *args.params, "M", "N", "k_run",
                                    "*strides", *kw])

    alloc = "{} = torch.empty((M, N), device=x.device, dtype=x.dtype)"
    shaped = ", ".join(f"buf_{v}.reshape(*lead, N)" for v in region.outputs)
    ret = f"return ({shaped}, ()) if save_z else ({shaped})"  # eval paths keep nothing (backward recomputes z)
    params = [n for n, _ in registry.values()]
    eval_lines = []
    if plan is not None:
        eval_outs = [f"buf_{v}" for v in post_outs]  # fold_plan: nothing before the norm is read outside
        eval_body = [alloc.format(o) for o in eval_outs] + [launch(name + "_folded", post_outs, a2, ("fold_b",))]
        eval_lines = [f"if not (bn.training or bn.running_mean is None):  # eval: the norm folded into W and b "
                      f"({FOLD_RULE})",
                      f"    {_fold_call(plan, registry)}",
                      *[f"    {ln}"
                        for ln in tuned_launch_lines(region.anchor, name + "_folded", eval_body, eval_outs)],
                      f"    {ret}"]
    elif evalk:
        eval_outs = [f"buf_{v}" for v in pre_outs + post_outs]
        eval_body = [alloc.format(o) for o in eval_outs] + [launch(name + '_eval', pre_outs + post_outs, a2)]
        eval_lines = ["if not (bn.training or bn.running_mean is None):  # eval: normalize with the running statistics",
                      *[f"    {ln}" for ln in tuned_launch_lines(region.anchor, name + "_eval", eval_body, eval_outs)],
                      f"    {ret}"]
    # y stays fp32 when only the apply pass reads it (exact for fp32 models, better for bf16 ones)
    def empty(v: str) -> str:
        return f"torch.empty((M, N), device=x.device, dtype={'x.dtype' if v in region.outputs else 'torch.float32'})"
    allocs = [f"buf_{y} = z if from_z else {empty(y)}", *[f"buf_{v} = {empty(v)}" for v in stats_outs[1:]]]
    stats_body = ["num_tiles = cdiv(M, cfg.block_m)",
                  "mean_part = torch.empty((num_tiles, N), device=x.device, dtype=torch.float32)",
                  "m2_part = torch.empty_like(mean_part)",
                  "z = torch.empty((M, N), device=x.device, dtype=x.dtype) if save_z else m2_part  # unused if not",
                  *allocs,
                  launch(name + "_stats", stats_outs, a1, ("mean_part", "m2_part", "z"),
                         ("STORE_Z=save_z", "STORE_Y=not from_z"))]
    stats_results = [f"buf_{v}" for v in stats_outs] + ["mean_part", "m2_part", "z", "ops"]
    lines = ["min_block_n = 16", *gemm_head(region.anchor), *eval_lines,
             "if M < 2:",
             "    raise ValueError(f'Expected more than 1 value per channel when training, got input size '"
             "\n                     f'{tuple(x.shape)}')",
             "factor = batch_norm_momentum(bn)  # counts the batch, as torch does",
             ("from_z = save_z and x.dtype == torch.float32  # apply recomputes y from z (kept at fp32)" if from_z_ok
              else "from_z = False  # y is read outside the region: the stats kernel stores it"),
             # the stats kernel writes only its own buffers: tuning may run it more than once
             *tuned_launch_lines(region.anchor, name + "_stats", stats_body, stats_results),
             "mean, rstd = batch_norm_stats(mean_part, m2_part, M, cfg.block_m, bn, factor)",
             *[alloc.format("buf_" + v) for v in post_outs],
             "bm, bn_ = (32, 128) if interpreting() else (16, 256)",
             call(f"{name}_apply_kernel[(cdiv(M, bm), cdiv(N, bn_))]", [f"buf_{y}", "mean", "rstd"],
                  [f"buf_{v}" for v in post_outs], a3.params,
                  ["M", "N", "FROM_Z=from_z", "BLOCK_M=bm", "BLOCK_N=bn_", "num_warps=4"]),
             f"return ({shaped}, {KEPT}) if save_z else ({shaped})"]
    in_eval = "running statistics folded into W and b in eval" if plan else "running statistics in eval"
    launch_src = launcher(f"fused_{name}", ["x", "weight", "bn", *params, "save_z=False"], lines,
                          f"Fused: {replaced}. Batch statistics in training mode, {in_eval}. "
                          f"{SAVE_Z_DOC} Nothing in eval.")
    weight = region.anchor.args[1]
    call_args = [region.anchor.args[0], operand_code(weight), attr_expr(bn.module), *registry]
    kernels = (stats, apply) + ((evalk[0],) if evalk else ())
    return forward_calls(region, f"fused_{name}", call_args, launch_src, kernels)


# part_ptr: (2, T, N) float64 row-block partials of PHASE 0 and 1 ((4, T, N) merged);
# stat_ptr: (4, N) float64 mean, rstd, m1, m2
PHASE_ARGS = (*plain("part_ptr", "stat_ptr"), constexpr("PHASE"))
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
    if len(region.anchor.shape) != 2:
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


def batchnorm_dz_kernel(region: Region, name: str) -> tuple[str, list[str], list[str], tuple[str, ...]]:
    """(kernel source, parameter and scalar expressions in kernel order, the extra epilogue_dz argument that
    runs the statistics phases with the norm's eps)."""
    src, params, scalars = dz_kernel(region, name, {"batch_norm": batchnorm_rule(region)}, PHASE_ARGS, "PHASE == 2")
    norm = next(n for n in region.nodes if n.op == "batch_norm")
    merged = ("bn_merged=True",) if region.nodes[-1] is norm else ()
    return src, params, scalars, (f"bn_eps=float({attr_expr(norm.module)}.eps)", *merged)


class GemmBatchNorm(EpilogueKind):
    name = "gemm_batchnorm"
    family = "gemm"
    at_ops = ("batch_norm",)
    kernel_modules = ("batchnorm",)

    def enters(self, walk: Walk, n: Node) -> bool:
        return norm_of_tile(walk, n, "batch_norm")

    def readable(self, walk: Walk) -> set[str]:
        """Ops after the norm run in its apply pass: they read the norm's value and what follows it."""
        at = next(i for i, m in enumerate(walk.members) if m.op == "batch_norm")
        return {m.name for m in walk.members[at:]}

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return generate(region, g, stem)

    def dz_plan(self, region: Region, stem: str) -> tuple[str, list[str], list[str], tuple[str, ...]] | None:
        return batchnorm_dz_kernel(region, stem) if batchnorm_dz_supported(region) else None

    def call_time_rewrites(self, region: Region) -> list[str]:
        return [FOLD_RULE] if fold_plan(region) else []


KIND = GemmBatchNorm()
