"""Region kind `conv_batchnorm`: convolution -> pointwise ops -> BatchNorm2d/3d (or BatchNorm1d over (N, C, L)) ->
pointwise ops, the convolution on kernels/conv.py's tile (or kernels/conv_transpose.py's stride phases).

Training mode (or no running statistics): each channel's mean and variance are over ALL N x spatial output pixels,
which no tile sees. Three launches (kernels/conv_norm.py, kernels/batchnorm.py):
  1. `<name>_stats_kernel`: the convolution and the ops before the norm; stores y (the norm's input) and, per
     (row tile, channel), the tile's mean and centred M2 in float64, and each tile's row count;
  2. `batch_norm_finalize_kernel` (kernels/batchnorm.py, given each tile's row count): merges the tiles per channel
     (Chan's combination, float64), writes mean and 1/std and updates running_mean / running_var in place
     (num_batches_tracked counted by the launcher);
  3. `<name>_apply_kernel`: one pass over y: (y - mean) * rstd * weight + bias, then the ops after the norm; with
     a windowed pool after them (nothing from the norm on read outside the region), in the pool's rows
     (regions/pool_pass.py): the norm and those ops at each window position, max / sum, the ops after the pool.
     Eval mode then runs the same passes with the running statistics (no fold, no single kernel).
Bytes beyond the convolution: y written once and read once (8 bytes per output element at fp32), the outputs
written once; torch would write the conv's output, read it twice for the norm (statistics, then normalize), write
the norm's output, and read and write it again for each pointwise op after it.
Eval mode: running statistics are per-channel constants. Where the norm reads the convolution's own output (no op
between) and nothing outside reads that output, the norm is folded into the convolution's weight and bias at call
time (rule `bn-eval-fold`: conv_bn_eval_fold, float64, cached by the versions of everything it reads) and one
kernel runs the convolution with b' and the ops after the norm. Otherwise one kernel normalizes with the running
statistics in its epilogue. The mode is read when ModelNew is called, as torch does.
Backward: the region recomputed in float64 torch (the norm by batch_norm_ref, with the statistics this call used)
and differentiated, as the convolution kinds do (kfuse/backward.py): correct, not fast.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Param, Region, attr_expr
from kfuse.ops import CONV_OPS
from kfuse.regions.common import (
    KernelArgs,
    RegionCode,
    bn_normalize,
    bn_params,
    call,
    launcher,
    operand_code,
    pointwise_lines,
    var,
)
from kfuse.regions.conv_common import (
    TRANSPOSED,
    WINDOWED,
    ConvForm,
    NormParts,
    conv_bias,
    conv_cost,
    conv_kernel,
    depthwise,
    form_of,
    geometry_code,
    has_twin,
    phase_tiled,
    pixel_kernel,
    pool_code,
    reads_outside,
    stores,
    tuned_launch,
)
from kfuse.regions.kind import Walk
from kfuse.regions.pool_pass import (
    POOL_PARAMS,
    NormThenPool,
    stored_pool_kernel,
    stored_pool_launch,
)

FOLD_RULE = "bn-eval-fold"

# per (tile, channel) partial statistics of the norm's input {y}, centred on the tile's own mean, in float64; the
# tile index counts row tiles within a phase (program_id(2), 0 for a plain convolution)
# The row count is summed and stored per (row tile, channel) like the moments (the same in every column): a count
# reduced to one scalar, or stored through a scalar pointer, did not compile in the Hopper twin (Gluon's layout
# inference, Triton 3.6: "parent layout must have at least rank >= 2", "tt.splat op failed to infer return type").
# program_id(2) is the stride phase of a transposed tile (0 in a convolution's two-dimensional grid and the twin's).
STATS_LINES = (
    "# per-channel partial statistics of this row tile (float64, centred on the tile's mean) and its row count",
    "tile = tl.program_id(2) * (tl.num_programs(0) // tl.cdiv(COUT_G, BLOCK_N)) + pid_m",
    "t_count = tl.sum(mask.to(tl.float64), axis=0)  # the tile's rows, in each of the group's columns",
    "t_y = tl.where(mask, {y}, 0.0).to(tl.float64)",
    "t_mean = tl.sum(t_y, axis=0) / tl.maximum(t_count, 1.0)",
    "t_dev = tl.where(mask, t_y - t_mean[None, :], 0.0)",
    "tl.store(mean_part_ptr + tile * C_out + offs_n, t_mean, mask=mask_n)",
    "tl.store(m2_part_ptr + tile * C_out + offs_n, tl.sum(t_dev * t_dev, axis=0), mask=mask_n)",
    "tl.store(count_ptr + tile * C_out + offs_n, t_count, mask=mask_n)",
)


def tile_count(form: ConvForm, sm90: bool) -> list[str]:
    """Launcher lines: `tiles`, the row tiles the stats kernel writes partials for (STATS_LINES' tile index)."""
    if sm90:
        return ["tiles = conv_row_tiles(geo, cfg)  # partials by row tile (of wide rows for the Hopper twin)"]
    return ["grid = " + f"{form.grid}(geo, cfg)  # partials by row tile",
            "tiles = grid[0] // cdiv(geo.COUT_G, cfg.block_n) * (grid[2] if len(grid) > 2 else 1)"]


def norm_node(region: Region) -> tuple[int, Node]:
    return next((i, n) for i, n in enumerate(region.nodes) if n.op == "batch_norm")



def can_fold(region: Region) -> bool:
    """Eval mode folds the norm into the convolution where that is exact and loses no value: running statistics,
    the norm reads the convolution's output directly, nothing outside the region reads that output, and no pool
    follows (its pass reads y)."""
    at, bn = norm_node(region)
    anchor = region.anchor
    return (at == 1 and bn.attrs.get("track_running_stats", True) and bn.args[0] == anchor.name
            and anchor.name not in region.outputs and not any(n.op in WINDOWED for n in region.nodes))



def apply_kernel(name: str, doc: str, outs: list[str], args: KernelArgs, body: list[str]) -> str:
    """`<name>_apply_kernel`: one pass over y (NC(D)HW, S pixels a channel plane) as (pixels, channels) tiles, the
    layout of the convolution's own tile (stores coalesced along the pixels); mean and rstd per channel."""
    lines = ["v_y = tl.load(y_ptr + out_offs, mask=mask, other=0.0).to(tl.float32)",
             "mean = tl.load(mean_ptr + offs_n, mask=mask_n, other=0.0)[None, :]",
             "rstd = tl.load(rstd_ptr + offs_n, mask=mask_n, other=1.0)[None, :]",
             *args.loads, *body]
    return pixel_kernel(f"{name}_apply_kernel", doc, ["y_ptr", "mean_ptr", "rstd_ptr", *[f"buf_{o}_ptr" for o in outs]],
                        args, (), lines)


def stats_kernel(region: Region, form: ConvForm, name: str, doc: str, p: NormParts,
                 registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Pass 1: the convolution and the ops before the norm; y, the region outputs before the norm, partials."""
    args, env = KernelArgs(registry), {}
    body = conv_bias(region.anchor, env, args) + pointwise_lines(p.before, env, args)
    body += stores(p.stored, env)
    body += [ln.format(y=env[p.y]) for ln in STATS_LINES]
    ptrs = [f"buf_{v}" for v in p.stored] + ["mean_part", "m2_part", "count"]
    return conv_kernel(form, f"{name}_stats", doc, ptrs, args, body, sm90=True), args


def eval_kernel(region: Region, form: ConvForm, name: str, doc: str, p: NormParts,
                registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Eval mode in one kernel: the convolution, the ops before the norm, (y - running_mean) / sqrt(running_var +
    eps) * weight + bias, the ops after it."""
    args, env = KernelArgs(registry), {}
    channels = region.anchor.shape[1]
    w, b, eps = bn_params(p.norm, channels)
    body = conv_bias(region.anchor, env, args) + pointwise_lines(p.before, env, args)
    rm = args.operand(Param(f"{p.norm.module}.running_mean", (channels,)), env)
    rv = args.operand(Param(f"{p.norm.module}.running_var", (channels,)), env)
    body += bn_normalize(var(p.norm.name), f"({env[p.y]} - {rm})", f"(1.0 / tl.sqrt({rv} + {args.operand(eps, env)}))",
                      w, b, env, args)
    env[p.norm.name] = var(p.norm.name)
    body += pointwise_lines(p.after, env, args) + stores(p.pre_outs + p.post_outs, env)
    outs = [f"buf_{v}" for v in p.pre_outs + p.post_outs]
    return conv_kernel(form, f"{name}_eval", doc, outs, args, body, sm90=True), args


def folded_kernel(region: Region, form: ConvForm, name: str, doc: str, p: NormParts,
                  registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Eval mode with the norm folded into W' and b' (conv_bn_eval_fold): acc + b', then the ops after the norm."""
    args, env = KernelArgs(registry), {}
    body = ["fold_b = tl.load(fold_b_ptr + offs_n, mask=mask_n, other=0.0)[None, :]",
            f"{var(p.norm.name)} = acc + fold_b  # {region.anchor.origin} and {p.norm.origin}, folded into W' and b'"]
    env[p.norm.name] = var(p.norm.name)
    body += pointwise_lines(p.after, env, args) + stores(p.post_outs, env)
    outs = [f"buf_{v}" for v in p.post_outs] + ["fold_b"]
    return conv_kernel(form, f"{name}_folded", doc, outs, args, body, sm90=True), args


def apply_pass(region: Region, name: str, doc: str, p: NormParts,
               registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Pass 3: normalize y with the batch statistics, then the ops after the norm; with a windowed pool after them,
    in the pool's rows (regions/pool_pass.py), the norm and those ops at each window position."""
    y = "v_y" if p.pool is None else "y"
    args, env = KernelArgs(registry), {p.y: y}
    w, b, _ = bn_params(p.norm, region.anchor.shape[1])
    body = bn_normalize(var(p.norm.name), f"({y} - mean)", "rstd", w, b, env, args)
    env[p.norm.name] = var(p.norm.name)
    body += pointwise_lines(p.after, env, args)
    if p.pool is not None:
        stats = ["mean = tl.load(mean_ptr + offs_n, mask=mask_n, other=0.0)[None, :]",
                 "rstd = tl.load(rstd_ptr + offs_n, mask=mask_n, other=1.0)[None, :]"]
        outs = {f"buf_{v}": v for v in p.post_outs}
        return stored_pool_kernel(f"{name}_apply_kernel", doc, p.pool, p.post, outs, args, env, (stats, body),
                                  (["mean_ptr", "rstd_ptr"], [])), args
    return apply_kernel(name, doc, p.post_outs, args, body + stores(p.post_outs, env)), args


def pooled_lines(stem: str, p: NormParts, a3: KernelArgs, head: list[str], allocate: list[str],
                 outs: str) -> list[str]:
    """The launcher's lines where a windowed pool follows the norm, in either mode: pass 1 stores y (its partials
    unused in eval mode), then the pooled apply pass with the batch statistics in training mode, the running ones in
    eval mode (no fold: the pool's pass reads y)."""
    return [*head,
            "M = geo.out_shape[0] * (torch.Size(geo.out_shape[2:]).numel())  # values per channel",
            "training = bn.training or bn.running_mean is None",
            "if training and M < 2:",
            "    raise ValueError(f'Expected more than 1 value per channel when training, got input size '"
            "\n                     f'{tuple(geo.out_shape)}')",
            "factor = batch_norm_momentum(bn) if training else None  # counts the batch, as torch does",
            *allocate,
            "if training:",
            "    mean, rstd = batch_norm_stats(mean_part, m2_part, M, count, bn, factor)  # count: each tile's rows",
            "else:  # eval: the running statistics",
            "    mean = bn.running_mean.float()",
            "    rstd = (bn.running_var.float() + bn.eps).rsqrt()",
            *stored_pool_launch(f"{stem}_apply_kernel", f"buf_{p.y}", [f"buf_{v}" for v in p.post_outs], a3,
                                (["mean", "rstd"], [])),
            f"return {outs}"]


def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    anchor, form, p = region.anchor, form_of(region.anchor), NormParts(region, ("batch_norm",))
    registry: dict[str, tuple[str, bool]] = {}
    replaced = ", ".join(n.origin for n in region.nodes)
    cost = conv_cost(anchor, g, 1)
    stats, a1 = stats_kernel(region, form, stem, f"Training-mode pass 1 of: {replaced}. {cost}", p, registry)
    apply, a3 = apply_pass(region, stem, f"Training-mode pass 3 of: {replaced}.", p, registry)
    pooled = p.pool is not None
    fold = can_fold(region)
    has_running = p.norm.attrs.get("track_running_stats", True)
    evalk = None  # a pool after the norm: no single-kernel eval mode (pooled_lines), and can_fold says no fold
    if fold:
        evalk = folded_kernel(region, form, stem, f"Eval mode, BatchNorm folded into the weights ({FOLD_RULE}): "
                              f"{replaced}. {cost}", p, registry)
    elif has_running and not pooled:
        evalk = eval_kernel(region, form, stem, f"Eval mode (running statistics): {replaced}. {cost}", p, registry)

    def empty(v: str, dtype: str = "x.dtype") -> str:
        return f"buf_{v} = torch.empty(geo.out_shape, device=x.device, dtype={dtype})"

    # one plan for the region's convolution kernels: the Hopper twin where each of them has one (has_twin)
    kinds = [("stats", stats), *([("folded" if fold else "eval", evalk[0])] if evalk is not None else [])]
    sm90 = all(has_twin(src, f"{stem}_{kind}") for kind, src in kinds)
    plan = form.plan_line(sm90)
    outs = ", ".join(f"buf_{v}" for v in region.outputs)
    lines = ["x = x.contiguous()", *form.prelude]
    if evalk is not None:
        lines.append("if not (bn.training or bn.running_mean is None):  # eval: running statistics")
        body = []
        if fold:
            bias = anchor.args[2]
            bias_name = registry[f"as_vector({bias.expr()})"][0] if isinstance(bias, Param) else "None"
            body.append(f"weight, fold_b = conv_bn_eval_fold(weight, {bias_name}, bn, {phase_tiled(anchor)}, "
                        f"groups)  # {FOLD_RULE}: W'")
        body += [plan,
                 *tuned_launch(form, f"{stem}_{'folded' if fold else 'eval'}",
                               [f"buf_{v}" for v in region.outputs] + (["fold_b"] if fold else []), evalk[1],
                               [f"buf_{v}" for v in region.outputs], [empty(v) for v in region.outputs], sm90=sm90),
                 f"return {outs}"]
        lines += [f"    {ln}" for ln in body]
    y_dtype = "x.dtype" if p.y in region.outputs else "torch.float32"  # y stays fp32 when only pass 3 reads it
    stats_launch = [empty(p.y, y_dtype), *[empty(v) for v in p.pre_outs if v != p.y],
                    *tuned_launch(form, f"{stem}_stats", [f"buf_{v}" for v in p.stored]
                                  + ["mean_part", "m2_part", "count"], a1, ["mean_part", "m2_part", "count"],
                                  [*tile_count(form, sm90),
                                   "mean_part = torch.empty((tiles, geo.C_out), device=x.device, dtype=torch.float64)",
                                   "m2_part = torch.empty_like(mean_part)",
                                   "count = torch.empty_like(mean_part)  # each tile's rows, per channel"], sm90=sm90)]
    if pooled:
        lines = pooled_lines(stem, p, a3, form.head(sm90), stats_launch, outs)
    else:
        lines += [plan,
                  "M = geo.out_shape[0] * (torch.Size(geo.out_shape[2:]).numel())  # values per channel",
                  "if M < 2:",
                  "    raise ValueError(f'Expected more than 1 value per channel when training, got input size '"
                  "\n                     f'{tuple(geo.out_shape)}')",
                  "factor = batch_norm_momentum(bn)  # counts the batch, as torch does",
                  *stats_launch,
                  "mean, rstd = batch_norm_stats(mean_part, m2_part, M, count, bn, factor)  # count: each tile's rows",
                  *[empty(v) for v in p.post_outs],
                  "S = M // geo.out_shape[0]",
                  "bm, bn_ = (min(triton.next_power_of_2(M), 8192), 64) if interpreting() else (128, 32)",
                  call(f"{stem}_apply_kernel[(cdiv(M, bm), cdiv(geo.C_out, bn_))]",
                       [f"buf_{p.y}", "mean", "rstd", *[f"buf_{v}" for v in p.post_outs], *a3.params],
                       ["M", "geo.C_out", "S", "BLOCK_M=bm", "BLOCK_N=bn_", "num_warps=4"]),
                  f"return {outs}"]
    in_eval = "folded into the weights in eval" if fold else "running statistics in eval"
    params = [n for n, _ in registry.values()]
    src = launcher(f"fused_{stem}", ["x", "weight", "bn", *params, *form.geometry, *(POOL_PARAMS if pooled else [])],
                   lines, f"Fused: {replaced}. Batch statistics in training mode, {in_eval}.")
    call_args = [anchor.args[0], operand_code(anchor.args[1]), attr_expr(p.norm.module), *registry,
                 *geometry_code(anchor), *(pool_code(p.pool) if pooled else [])]
    kernels = (stats, apply) + ((evalk[0],) if evalk else ())
    return RegionCode(kernels, src, (f"{', '.join(region.outputs)} = {call(f'fused_{stem}', call_args)}",))


def norm_after_conv(walk: Walk, n: Node) -> bool:
    """A BatchNorm module over a convolution's whole output (channels in dim 1), the walk's first norm."""
    anchor = walk.anchor
    if anchor.op in CONV_OPS and depthwise(anchor):  # the direct tile (kernels/conv_depthwise.py) has no statistics
        return False
    return (anchor.op in (*CONV_OPS, TRANSPOSED) and n.op == "batch_norm" and bool(n.module) and len(n.args) == 1
            and isinstance(n.args[0], str) and n.args[0] in walk.values and n.shape == anchor.shape
            and len(n.shape) >= 3 and not any(m.op == "batch_norm" for m in walk.members))


class ConvBatchNorm(NormThenPool):
    name = "conv_batchnorm"
    family = "conv"
    at_ops = ("batch_norm",)
    kernel_modules = ("conv", "conv_transpose", "conv_norm")
    norm_input = False  # its apply pass reads the normalized values only

    def enters(self, walk: Walk, n: Node) -> bool:
        return norm_after_conv(walk, n) and not reads_outside(walk)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return generate(region, g, stem)

    def call_time_rewrites(self, region: Region) -> list[str]:
        return [FOLD_RULE] if can_fold(region) else []


KIND = ConvBatchNorm()
