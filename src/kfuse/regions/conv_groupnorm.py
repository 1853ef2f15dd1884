"""Region kind `conv_groupnorm`: convolution -> pointwise ops -> GroupNorm or InstanceNorm1d/2d/3d (GroupNorm with
one channel a group) -> pointwise ops, the convolution on kernels/conv.py's tile (or kernels/conv_transpose.py's
stride phases).

Each (sample, group)'s mean and variance are over the group's channels and every output pixel of the sample. A row
tile of the convolution (rows = n * S + s) may end inside one sample and start the next, and a group may span many
row tiles and several column tiles, so no tile sees a group whole: the statistics are two-phase. Three launches
(kernels/conv_norm.py):
  1. `<name>_stats_kernel`: the convolution and the ops before the norm; stores y (the norm's input) and, for each
     sample among the tile's rows (at most `slots`), that sample's per-channel mean and centred M2 over those rows in
     float64 and their count, under entry (sample, phase, j) (conv_gn_layout);
  2. `conv_gn_stats`: merges each (sample, channel)'s entries, then each (sample, group)'s channels (Chan's
     combination, float64): mean and 1/std per (sample, group);
  3. `<name>_apply_kernel`: one pass over y: (y - mean) * rstd [* weight + bias], then the ops after the norm (which
     may also read y itself: a residual `conv + f(norm(conv))`); with a windowed pool after them (nothing from the
     norm on read outside the region), in the pool's rows (regions/pool_pass.py): the norm and those ops at each
     window position, max / sum, then the ops after the pool, only the pooled values stored.
With a mean over the spatial dims of the norm's output itself (a global average pool, `x.mean((2, 3))`; a mean over
the channels too is split by rewrite.py), pass 1 stores no y and pass 3 is `<name>_mean_kernel` over (sample,
channel): the mean of the normalized values is (channel mean - group mean) * rstd, from the statistics' float64
channel means, then the affine (which commutes with the mean) and the ops after the mean.
The group count is read from the module when ModelNew runs; eps too. GroupNorm and InstanceNorm without running
statistics act alike in training and eval mode (capture keeps an InstanceNorm that tracks running statistics a torch
call).
Bytes beyond the convolution: y written once and read once (8 bytes per output element at fp32), the outputs written
once; torch would write the conv's output, read it twice for the norm, write the norm's output, and read and write it
again for each pointwise op after it.
Backward: the region recomputed in float64 torch (F.group_norm / F.instance_norm) and differentiated, as the
convolution kinds do (kfuse/backward.py): correct, not fast.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Param, Region
from kfuse.ops import CONV_OPS
from kfuse.regions.common import (
    KernelArgs,
    RegionCode,
    affine_lines,
    call,
    constexpr,
    docstring,
    launcher,
    operand_code,
    plain,
    pointwise_lines,
    signature,
    var,
)
from kfuse.regions.conv_common import (
    SAMPLE_ROWS,
    TRANSPOSED,
    ConvForm,
    NormParts,
    conv_bias,
    conv_cost,
    conv_kernel,
    depthwise,
    form_of,
    geometry_code,
    mean_outputs,
    pixel_kernel,
    pixel_launch,
    pool_code,
    reads_outside,
    stores,
    tuned_launch,
)
from kfuse.regions.kind import Walk, group_size
from kfuse.regions.pool_pass import (
    POOL_PARAMS,
    NormThenPool,
    stored_pool_kernel,
    stored_pool_launch,
)

NORMS = ("group_norm", "instance_norm")
# stats-kernel sizes beyond the convolution's: samples a tile may touch, entries a sample has per phase
LAYOUT = ("SLOTS", "J")

# For each sample among the tile's rows: its rows' per-channel mean and centred M2 (float64) and their count, stored
# under entry (sample, phase, j), j = this tile's index among the row tiles touching the sample. {y}: the norm's input.
STATS_LINES = (
    "# per-(sample, channel) partial statistics of this row tile (float64, centred on the segment's own mean)",
    "r_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # the tile's rows (of its phase)",
    "n_row = r_m // S_rows",
    "n_first = (pid_m * BLOCK_M) // S_rows",
    "y64 = {y}.to(tl.float64)  # converted once for every slot",
    "for s in range(SLOTS):",
    "    n_s = n_first + s",
    "    in_s = mask_m & (n_row == n_s)",
    "    s_rows = tl.sum(in_s.to(tl.int32), axis=0)",
    "    if s_rows > 0:  # most tiles hold one sample's rows: an empty slot costs no float64 work",
    "        s_count = s_rows.to(tl.float64)",
    "        s_in = in_s[:, None] & mask_n[None, :]",
    "        s_y = tl.where(s_in, y64, 0.0)",
    "        s_mean = tl.sum(s_y, axis=0) / s_count",
    "        s_dev = tl.where(s_in, s_y - s_mean[None, :], 0.0)",
    "        entry = (n_s.to(tl.int64) * tl.num_programs(2) + tl.program_id(2)) * J + (pid_m - (n_s * S_rows) // "
    "BLOCK_M)",
    "        tl.store(mean_part_ptr + entry * C_out + offs_n, s_mean, mask=mask_n)",
    "        tl.store(m2_part_ptr + entry * C_out + offs_n, tl.sum(s_dev * s_dev, axis=0), mask=mask_n)",
    "        tl.store(count_ptr + entry, s_count)",
)


def norm_args(n: Node) -> tuple[object, Param | None, Param | None, object]:
    """(groups or None for one channel a group, weight, bias, eps) of a GroupNorm or InstanceNorm node."""
    if n.op == "group_norm":
        _x, groups, w, b, eps = n.args
        return groups, w, b, eps
    _x, w, b, eps = n.args
    return None, w, b, eps


def stats_kernel(region: Region, form: ConvForm, name: str, doc: str, p: NormParts,
                 registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Pass 1: the convolution and the ops before the norm; y, the region outputs before the norm, the partials."""
    args, env = KernelArgs(registry), {}
    body = conv_bias(region.anchor, env, args) + pointwise_lines(p.before, env, args)
    body += stores(p.stored, env) + list(SAMPLE_ROWS[form.plan]) + [ln.format(y=env[p.y]) for ln in STATS_LINES]
    outs = [f"buf_{v}" for v in p.stored] + ["mean_part", "m2_part", "count"]
    return conv_kernel(form, f"{name}_stats", doc, outs, args, body, LAYOUT), args


def apply_kernel(region: Region, name: str, doc: str, p: NormParts,
                 registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Pass 3: one pass over y (NC(D)HW, S pixels a channel plane) as (pixels, channels) tiles, the layout of the
    convolution's own tile; mean and rstd per (sample, group), then the affine and the ops after the norm. With a
    windowed pool after them: in the pool's rows (pool_pass.py), the norm applied at each window position."""
    args, env = KernelArgs(registry), {p.y: "v_y" if p.pool is None else "y"}
    _groups, w, b, _eps = norm_args(p.norm)
    out = var(p.norm.name)
    body = [f"{out} = ({env[p.y]} - g_mean) * g_rstd  # {p.norm.origin}", *affine_lines(out, w, b, env, args)]
    env[p.norm.name] = out
    body += pointwise_lines(p.after, env, args)
    rows = "offs_m // S" if p.pool is None else "n_idx"
    stats = [f"g_at = ({rows})[:, None] * NUM_GROUPS + (offs_n // GROUP)[None, :]  # < N * groups: int32",
             "g_mean = tl.load(g_mean_ptr + g_at, mask=mask, other=0.0)",
             "g_rstd = tl.load(g_rstd_ptr + g_at, mask=mask, other=1.0)"]
    if p.pool is not None:
        outs = {f"buf_{v}": v for v in p.post_outs}
        return stored_pool_kernel(f"{name}_apply_kernel", doc, p.pool, p.post, outs, args, env, (stats, body),
                                  (["g_mean_ptr", "g_rstd_ptr"], ["GROUP", "NUM_GROUPS"])), args
    lines = ["v_y = tl.load(y_ptr + out_offs, mask=mask, other=0.0).to(tl.float32)", *stats, *args.loads, *body,
             *stores(p.post_outs, env)]
    pointers = ["y_ptr", "g_mean_ptr", "g_rstd_ptr", *[f"buf_{o}_ptr" for o in p.post_outs]]
    return pixel_kernel(f"{name}_apply_kernel", doc, pointers, args, ("GROUP", "NUM_GROUPS"), lines), args


def mean_kernel(region: Region, name: str, doc: str, p: NormParts,
                registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Pass 3 with a spatial mean of the norm's output: over (samples, channels) tiles, the mean of the normalized
    values from the float64 channel and group means, the affine, the ops after the mean (in float64), stored per
    (n, c)."""
    args, env = KernelArgs(registry), {}
    _groups, w, b, _eps = norm_args(p.norm)
    out = var(p.mean.name)
    body = ["g_at = offs_m[:, None] * NUM_GROUPS + (offs_n // GROUP)[None, :]",
            "c_mean = tl.load(ch_mean_ptr + at, mask=mask, other=0.0)  # float64",
            "g_mean = tl.load(g_mean_ptr + g_at, mask=mask, other=0.0)  # float64",
            "g_rstd = tl.load(g_rstd_ptr + g_at, mask=mask, other=1.0)",
            # float64 through the ops after the mean (one value per (n, c)): eager's error there is tiny, and an
            # fp32 tanh of runtime.py's (a few ulps) alone would exceed rule 3's bound
            f"{out} = (c_mean - g_mean) * g_rstd  # {p.mean.origin} of {p.norm.origin}",
            *affine_lines(out, w, b, env, args)]
    env[p.mean.name] = out
    body += pointwise_lines(p.post, env, args)
    lines = ["offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # samples",
             "offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # channels",
             "mask_n = offs_n < C_out",
             "mask = (offs_m < N)[:, None] & mask_n[None, :]",
             "at = offs_m[:, None].to(tl.int64) * C_out + offs_n[None, :]", *args.loads, *body,
             *[f"tl.store(buf_{v}_ptr + at, {env[v]}, mask=mask)" for v in p.post_outs]]
    decls = (*plain("ch_mean_ptr", "g_mean_ptr", "g_rstd_ptr", *[f"buf_{v}_ptr" for v in p.post_outs]),
             *args.decls(), *plain("N", "C_out", "GROUP", "NUM_GROUPS"), constexpr("BLOCK_M"), constexpr("BLOCK_N"))
    return "\n".join(["@triton.jit", f"def {name}_mean_kernel({signature(decls)}):", docstring(doc),
                      *[f"    {ln}" for ln in lines]]) + "\n", args


def mean_launch(stem: str, region: Region, p: NormParts, a3: KernelArgs) -> list[str]:
    """Launcher lines of pass 3 with a spatial mean: the statistics with the channel means, one launch over (N, C)."""
    outs = [f"buf_{v}" for v in p.post_outs]
    return ["ch_mean, g_mean, g_rstd = conv_gn_stats(mean_part, m2_part, count, norm_groups, norm_eps, "
            "channel_means=True)",
            *mean_outputs(outs, region, p.post_outs),
            "if N * C:",
            "    " + call(f"{stem}_mean_kernel[(cdiv(N, 16), cdiv(C, 64))]",
                          ["ch_mean", "g_mean", "g_rstd", *outs, *a3.params, "N", "C", "C // norm_groups",
                           "norm_groups"], ["BLOCK_M=16", "BLOCK_N=64"], indent=8)]


def apply_launch(stem: str, p: NormParts, a3: KernelArgs) -> list[str]:
    """Launcher lines of pass 3: over y's pixels, or over the pool's rows."""
    outs = [f"buf_{v}" for v in p.post_outs]
    if p.pool is not None:
        return stored_pool_launch(f"{stem}_apply_kernel", f"buf_{p.y}", outs, a3,
                                  (["g_mean", "g_rstd"], ["C // norm_groups", "norm_groups"]))
    return [*[f"{o} = torch.empty(geo.out_shape, device=x.device, dtype=x.dtype)" for o in outs],
            *pixel_launch(f"{stem}_apply_kernel", [f"buf_{p.y}", "g_mean", "g_rstd", *outs, *a3.params],
                          ["C // norm_groups", "norm_groups"])]


def launcher_lines(region: Region, form: ConvForm, stem: str, p: NormParts, a1: KernelArgs,
                   a3: KernelArgs) -> list[str]:
    def empty(v: str, dtype: str = "x.dtype") -> str:
        return f"buf_{v} = torch.empty(geo.out_shape, device=x.device, dtype={dtype})"

    y_dtype = "x.dtype" if p.y in region.outputs else "torch.float32"  # y stays fp32 when only pass 3 reads it
    lines = [*form.head(),
             "N, C = geo.out_shape[0], geo.C_out",
             "S = torch.Size(geo.out_shape[2:]).numel()  # pixels a channel plane",
             "norm_groups = C if norm_groups is None else norm_groups  # InstanceNorm: one channel a group",
             "if norm_groups <= 0 or C % norm_groups:",
             "    raise ValueError(f'GroupNorm: {C} channels are not divisible into {norm_groups} groups')"]
    if p.norm.op == "instance_norm":  # torch's F.instance_norm check
        lines += ["if S == 1:",
                  "    raise ValueError(f'Expected more than 1 spatial element when training, got input size "
                  "{tuple(geo.out_shape)}')"]
    lines += [*([empty(p.y, y_dtype)] if p.y in p.stored else []), *[empty(v) for v in p.pre_outs if v != p.y],
              *tuned_launch(form, f"{stem}_stats", [f"buf_{v}" for v in p.stored] + ["mean_part", "m2_part", "count",
                                                                                      "slots", "J"], a1,
                            ["mean_part", "m2_part", "count"],
                            ["phases, J, slots = conv_gn_layout(geo, cfg.block_m)  # partials by row tile",
                             "mean_part = torch.zeros((N, phases * J, C), device=x.device, dtype=torch.float64)",
                             "m2_part = torch.zeros_like(mean_part)",
                             "count = torch.zeros((N, phases * J), device=x.device, dtype=torch.float64)"]),
              *(["g_mean, g_rstd = conv_gn_stats(mean_part, m2_part, count, norm_groups, norm_eps)",
                 *apply_launch(stem, p, a3)] if p.mean is None else mean_launch(stem, region, p, a3)),
              f"return {', '.join(f'buf_{v}' for v in region.outputs)}"]
    return lines


def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    anchor, form, p = region.anchor, form_of(region.anchor), NormParts(region, NORMS)
    registry: dict[str, tuple[str, bool]] = {}
    replaced = ", ".join(n.origin for n in region.nodes)
    stats, a1 = stats_kernel(region, form, stem, f"Pass 1 of: {replaced}. {conv_cost(anchor, g, 1)}", p, registry)
    third = apply_kernel if p.mean is None else mean_kernel
    apply, a3 = third(region, stem, f"Pass 3 of: {replaced}.", p, registry)
    params = [n for n, _ in registry.values()]
    pooled = p.pool is not None
    src = launcher(f"fused_{stem}", ["x", "weight", "norm_groups", "norm_eps", *params, *form.geometry,
                                     *(POOL_PARAMS if pooled else [])],
                   launcher_lines(region, form, stem, p, a1, a3),
                   f"Fused: {replaced}. Statistics per (sample, group) from per-tile partials segmented by sample.")
    groups, _w, _b, eps = norm_args(p.norm)
    call_args = [anchor.args[0], operand_code(anchor.args[1]), "None" if groups is None else f"int({groups.expr()})",
                 f"float({eps.expr()})", *registry, *geometry_code(anchor), *(pool_code(p.pool) if pooled else [])]
    return RegionCode((stats, apply), src, (f"{', '.join(region.outputs)} = {call(f'fused_{stem}', call_args)}",))


def per_channel(a: object, channels: int) -> bool:
    return a is None or (isinstance(a, Param) and a.shape == (channels,))


def norm_after_conv(walk: Walk, n: Node) -> bool:
    """A GroupNorm (groups dividing the channels) or InstanceNorm over a convolution's whole output, the walk's first
    norm, its affine per channel."""
    anchor = walk.anchor
    if anchor.op in CONV_OPS and depthwise(anchor):  # the direct tile (kernels/conv_depthwise.py) has no statistics
        return False
    if (anchor.op not in (*CONV_OPS, TRANSPOSED) or n.op not in NORMS or n.shape != anchor.shape or len(n.shape) < 3
            or not (isinstance(n.args[0], str) and n.args[0] in walk.values)
            or any(m.op in (*NORMS, "batch_norm") for m in walk.members)):
        return False
    channels = anchor.shape[1]
    if n.op == "group_norm":
        return group_size(n, channels) is not None
    return len(n.args) == 4 and per_channel(n.args[1], channels) and per_channel(n.args[2], channels)


class ConvGroupNorm(NormThenPool):
    name = "conv_groupnorm"
    takes_mean = True
    family = "conv"
    kernel_modules = ("conv", "conv_transpose", "conv_norm")
    at_ops = NORMS

    def enters(self, walk: Walk, n: Node) -> bool:
        return norm_after_conv(walk, n) and not reads_outside(walk)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return generate(region, g, stem)


KIND = ConvGroupNorm()
