"""Region kind `conv_pool`: convolution -> pointwise ops -> a pool over the spatial dims -> pointwise ops, the
convolution's output never stored (kernels/pooling.py).

Pools: MaxPool/AvgPool 1d/2d/3d and F.max_pool/avg_pool{1,2,3}d at any geometry torch takes (capture's `pool`, and
its `max_pool1d` / `avg_pool1d` of non-overlapping 1-d windows), without return_indices; AdaptiveAvgPool to one pixel
and a mean over every spatial dim (capture's `mean_dims`, or `mean` over the one spatial dim of a Conv1d).
Windowed pools: one kernel whose rows are pooled pixels, looping over each window's conv pixels (the ops before the
pool run on each conv pixel, then max / sum), then the ops after the pool on the pooled tile, stored as NC(D)HW.
Global means: two kernels, per-(sample, pixel tile, channel) float64 sums of the ops before the mean, then a finalize
that adds a sample's tiles, divides, and runs the ops after the mean.
A transposed convolution's pools (unless KFUSE_TRANSPOSED_POOLS=0; its stride-phase tile cannot be recomputed per
window position, nor regrouped into whole samples): a windowed pool in two passes, the phase tiles storing y (the
pool's input, after the ops before the pool), then `<name>_kernel` over y in the same pooled-pixel rows, its window
loop loading y, and the ops after the pool; a global mean as the phase tiles' float64 sums per (sample, phase, row
tile) (kernels/pooling.py store_segment_sums), then the finalize, y never stored.
Anchors: a convolution's pointwise region (a transposed one's as above); the kind takes its walk over at the pool, where
nothing outside the region reads a value before the pool (the pool's rows never see the whole conv output, so such a
value could not be stored). The ops after the pool read the pooled values, numbers and per-channel parameters; after
a global mean, views that keep one value per (sample, channel) join too (`.squeeze(-1)`, `.flatten(1)`).
Backward: the region recomputed in float64 torch (the pool by its own call, as written) and differentiated.
"""

from __future__ import annotations

import os

from kfuse.ir import Graph, Node, Region
from kfuse.regions.common import (
    KernelArgs,
    RegionCode,
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
    CONV,
    CONV_CONSTEXPRS,
    DIRECT_COST,
    MEANS,
    PACKED_COST,
    SAMPLE_ROWS,
    TILE_LAUNCH,
    WINDOWED,
    conv_bias,
    conv_kernel,
    depthwise,
    form_of,
    geometry_code,
    is_global_mean,
    joins_after_pool,
    mean_at,
    mean_outputs,
    phase_tiled,
    pool_at,
    pool_code,
    reads_outside,
    runs_direct,
    tuned_launch,
    tuned_lines,
)
from kfuse.regions.kind import RegionKind, Walk, numel
from kfuse.regions.pool_pass import (
    POOL_PARAMS,
    POOL_SIZES,
    WINDOW_PIXEL,
    indented,
    is_windowed,
    pooling,
    read_only_inside,
    stored_pool_kernel,
    stored_pool_launch,
)

# the conv tile at the rows' conv pixels (od, oh, ow) of samples n_idx, where `valid`
TILE_AT = call("acc = conv_tile_at", ["x_ptr", "w_ptr", "w_lo_ptr", "w_scale_ptr", "x_scale_ptr", "stride_wn", "n_idx",
                                      "od", "oh", "ow", "valid", "pid_n", "g"],
               ["C_in", "D", "H", "W", "OD", "OH", "OW", "CIN_G", "COUT_G", "KD", "KH", "KW", "SD", "SH", "SW", "PD",
                "PH", "PW", "DD", "DH", "DW", "BLOCK_M", "BLOCK_N", "BLOCK_K", "SCHEME", "DENSE"], width=112, indent=8)
COLUMNS = ["offs_c = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # channels within group g",
           "offs_n = g * COUT_G + offs_c  # the output channels",
           "mask_n = offs_c < COUT_G",
           "mask = mask_m[:, None] & mask_n[None, :]"]


TRANSPOSED_SWITCH = "KFUSE_TRANSPOSED_POOLS"  # "0": a transposed convolution's pools stay torch calls


def transposed_pools_on() -> bool:
    """On unless switched off: on an H200 the windowed pool's two passes beat the region plus torch's pool on
    KernelBench level 2 50, 74 and 89 by 6-13% (benchmarks/conv/NOTES.md, "A windowed pool after a transposed
    convolution")."""
    return os.environ.get(TRANSPOSED_SWITCH, "1") != "0"


def pool_after_conv(walk: Walk, n: Node) -> bool:
    """A windowed pool or a global mean of a value of the walk (at the conv's shape), nothing before it read outside
    the region; after a transposed convolution, when switched on."""
    anchor, g = walk.anchor, walk.g
    if (phase_tiled(anchor) and not transposed_pools_on()) or depthwise(anchor) or not n.args \
            or n.args[0] not in walk.values:
        return False
    if g.shape_of(n.args[0]) != anchor.shape or numel(n.shape) == 0:
        return False
    if not (is_windowed(n, anchor.attrs.get("dims", 0)) or is_global_mean(n, g)):
        return False
    return read_only_inside(walk.members, n, g)


def frame(name: str, doc: str, ptrs: list[str], args: KernelArgs, extra: tuple, lines: list[str]) -> str:
    decls = (*CONV.params, *plain(*[f"{p}_ptr" for p in ptrs]), *args.decls(), *CONV.sizes, *extra,
             *CONV_CONSTEXPRS)
    return "\n".join(["@triton.jit", f"def {name}({signature(decls)}):", docstring(doc),
                      *[f"    {ln}" for ln in lines]]) + "\n"


def windowed_kernel(region: Region, stem: str, doc: str, outs: list[str],
                    registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Rows = pooled pixels; each window position's conv tile, the ops before the pool, max / sum; then the ops
    after it. With a global mean after them: rows = one sample's pooled pixels (program_id(2) is the sample) and,
    instead of stores, the float64 partial sums of the mean's input per (sample, pixel tile, channel)."""
    nodes, args, env = list(region.nodes), KernelArgs(registry), {}
    at, m_at = pool_at(nodes), mean_at(nodes)
    pool = nodes[at]
    pre = conv_bias(region.anchor, env, args) + pointwise_lines(nodes[1:at], env, args)
    start, combine, finish = pooling(pool, env[pool.args[0]])
    env[pool.name] = var(pool.name)
    post = pointwise_lines(nodes[at + 1:m_at], env, args)
    window = [WINDOW_PIXEL, "valid = mask_m & inside  # pool padding: no conv pixel, nothing read",
              *TILE_AT.splitlines(), *pre, *combine]
    if m_at is None:
        rows = ["offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # pooled pixels", "mask_m = offs_m < PM"]
        tail = ["out_offs = conv_out_offsets(offs_m, offs_n, QD, QH, QW, C_out)",
                *[f"tl.store({o}_ptr + out_offs, {env[v]}, mask=mask)" for o, v in zip(outs, region.outputs)]]
    else:
        rows = ["n_row, offs_s, mask_m = sample_rows(pid_m, PM // (QD * QH * QW), QD * QH * QW, BLOCK_M, P)",
                "offs_m = n_row * (QD * QH * QW) + offs_s  # whole samples' pooled pixels"]
        tail = partial_lines(env[nodes[m_at].args[0]], nodes[m_at].origin, "PM // (QD * QH * QW)", "QD * QH * QW")
        outs = ["part"]
    lines = ["pid_m, pid_n, g = conv_tile_ids(COUT_G, BLOCK_N)", *rows,
             "n_idx, qd, qh, qw = pool_rows(offs_m, QD, QH, QW)", *COLUMNS, *args.loads, start,
             "for w in range(0, PKD * PKH * PKW):  # the window's conv pixels",
             *[f"    {ln}" for ln in window], *finish, *post, *tail]
    extra = (*POOL_SIZES, constexpr("COUNT_PAD"), *((constexpr("P"),) if m_at is not None else ()))
    return frame(f"{stem}_kernel", doc, outs, args, extra, lines), args


def transposed_mean_generate(region: Region, g: Graph, stem: str) -> RegionCode:
    """A transposed convolution's global mean: the phase tiles' per-(sample, phase, row tile) float64 sums of the
    mean's input (`<stem>_partial_kernel`), then the finalize (as a plain convolution's mean)."""
    anchor, nodes = region.anchor, list(region.nodes)
    at = pool_at(nodes)
    mean = nodes[at]
    outs = [f"out{i}" for i in range(len(region.outputs))]
    doc = f"Fused: {', '.join(n.origin for n in nodes)}. {cost(region, g, mean)}"
    registry: dict[str, tuple[str, bool]] = {}
    a1, env, form = KernelArgs(registry), {}, form_of(anchor)
    body = [*conv_bias(anchor, env, a1), *pointwise_lines(nodes[1:at], env, a1),
            f"# partial sums of {mean.origin}", *SAMPLE_ROWS[form.plan],
            call("store_segment_sums", ["part_ptr", env[mean.args[0]], "mask_m", "offs_n", "mask_n", "pid_m",
                                        "S_rows", "SLOTS", "J", "C_out", "BLOCK_M"])]
    partial = conv_kernel(form, f"{stem}_partial", f"Phase 1 of: {doc}", ["part"], a1, body, ("SLOTS", "J"))
    finalize, a2 = finalize_kernel(region, stem, doc, outs, registry)
    lines = [*form.head(),
             "N, C = geo.out_shape[:2]",
             "S = torch.Size(geo.out_shape[2:]).numel()  # conv pixels per sample",
             *mean_outputs(outs, region),
             *tuned_launch(form, f"{stem}_partial", ["part", "slots", "J"], a1, ["part", "T"],
                           ["phases, J, slots = conv_gn_layout(geo, cfg.block_m)  # entries by phase and row tile",
                            "T = phases * J  # entries a sample",
                            "part = torch.zeros((N * T, C), device=x.device, dtype=torch.float64)  # unwritten: 0"]),
             *finalize_lines(stem, outs, a2),
             f"return {', '.join(outs)}"]
    params = [n for n, _ in registry.values()]
    src = launcher(f"fused_{stem}", ["x", "weight", *params, *form.geometry], lines, doc)
    call_args = [anchor.args[0], operand_code(anchor.args[1]), *registry, *geometry_code(anchor)]
    return RegionCode((partial, finalize), src, (f"{', '.join(region.outputs)} = {call(f'fused_{stem}', call_args)}",))


def transposed_generate(region: Region, g: Graph, stem: str) -> RegionCode:
    """A transposed convolution's windowed pool: the phase tiles storing y (the ops before the pool applied), then
    stored_pool_kernel over y."""
    anchor, nodes = region.anchor, list(region.nodes)
    at = pool_at(nodes)
    pool = nodes[at]
    outs = [f"out{i}" for i in range(len(region.outputs))]
    doc = f"Fused: {', '.join(n.origin for n in nodes)}. {cost(region, g, pool)}"
    registry: dict[str, tuple[str, bool]] = {}
    a1, env = KernelArgs(registry), {}
    body = conv_bias(anchor, env, a1) + pointwise_lines(nodes[1:at], env, a1)
    body.append(f"tl.store(y_ptr + out_offs, {env[pool.args[0]]}, mask=mask)  # the pool's input")
    form = form_of(anchor)
    conv = conv_kernel(form, f"{stem}_conv", f"Pass 1 of: {doc}", ["y"], a1, body)
    a2 = KernelArgs(registry)
    pooled = stored_pool_kernel(f"{stem}_kernel", f"Pass 2 of: {doc}", pool, nodes[at + 1:],
                                dict(zip(outs, region.outputs)), a2, {})
    lines = [*form.head(),
             *tuned_launch(form, f"{stem}_conv", ["y"], a1, ["y"],  # the tile tuned as the epilogue's
                           ["y = torch.empty(geo.out_shape, device=x.device, dtype=torch.float32)  # pool input"]),
             *stored_pool_launch(f"{stem}_kernel", "y", outs, a2),
             f"return {', '.join(outs)}"]
    params = [n for n, _ in registry.values()]
    src = launcher(f"fused_{stem}", ["x", "weight", *params, *form.geometry, *POOL_PARAMS], lines, doc)
    call_args = [anchor.args[0], operand_code(anchor.args[1]), *registry, *geometry_code(anchor), *pool_code(pool)]
    return RegionCode((conv, pooled), src, (f"{', '.join(region.outputs)} = {call(f'fused_{stem}', call_args)}",))


def partial_lines(y: str, origin: str, samples: str, pixels: str) -> list[str]:
    """Each sample's float64 column sums of y over its slot of this tile, stored at (sample, tile)."""
    return [f"# partial sums of {origin}",
            call("store_sample_partials", ["part_ptr", y, "mask", "offs_n", "mask_n", "pid_m", samples, pixels,
                                           "C_out", "BLOCK_M", "BLOCK_N", "P"])]


def mean_partial_kernel(region: Region, stem: str, doc: str,
                        registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Phase 1 of a global mean of conv pixels (`<stem>_partial_kernel`): one sample's pixel tile, the ops before
    the mean, float64 column sums."""
    nodes, env = list(region.nodes), {}
    at = pool_at(nodes)
    a1 = KernelArgs(registry)
    pre = conv_bias(region.anchor, env, a1) + pointwise_lines(nodes[1:at], env, a1)
    lines = ["pid_m, pid_n, g = conv_tile_ids(COUT_G, BLOCK_N)",
             "n_idx, sp, mask_m = sample_rows(pid_m, M // (OD * OH * OW), OD * OH * OW, BLOCK_M, P)  # whole samples",
             "od, oh, ow, valid = sp // (OH * OW), (sp // OW) % OH, sp % OW, mask_m", *TILE_AT.splitlines(), *COLUMNS,
             *a1.loads, *pre,
             *partial_lines(env[nodes[at].args[0]], nodes[at].origin, "M // (OD * OH * OW)", "OD * OH * OW")]
    return frame(f"{stem}_partial_kernel", f"Phase 1 of: {doc}", ["part"], a1, (constexpr("P"),), lines), a1


# a (samples, tiles, channels) block of the partials per step: BLOCK_T tiles at once, so a long T is few steps
FINALIZE_SUM = ("offs_t = tl.arange(0, BLOCK_T)",
                "total = tl.zeros((BLOCK_M, BLOCK_T, BLOCK_N), tl.float64)",
                "for t0 in range(0, T, BLOCK_T):",
                "    m3 = mask[:, None, :] & (t0 + offs_t < T)[None, :, None]",
                "    rows = offs_m[:, None, None].to(tl.int64) * T + (t0 + offs_t)[None, :, None]",
                "    total += tl.load(part_ptr + rows * C_out + offs_n[None, None, :], mask=m3, other=0.0)")


def finalize_kernel(region: Region, stem: str, doc: str, outs: list[str],
                    registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Phase 2 of a global mean (`<stem>_finalize_kernel`): a sample's tiles added, / S, the ops after the mean,
    stored as (samples, channels)."""
    nodes = list(region.nodes)
    at = mean_at(nodes)
    mean = nodes[at]
    a2, env2 = KernelArgs(registry), {mean.name: var(mean.name)}
    post = pointwise_lines(nodes[at + 1:], env2, a2)
    body = ["offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # samples",
            "offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # channels",
            "mask_n = offs_n < C_out",
            "mask = (offs_m < N)[:, None] & mask_n[None, :]", *a2.loads,
            *FINALIZE_SUM, f"{var(mean.name)} = (tl.sum(total, axis=1) / S).to(tl.float32)  # {mean.origin}", *post,
            *[f"tl.store({o}_ptr + offs_m[:, None].to(tl.int64) * C_out + offs_n[None, :], {env2[v]}, mask=mask)"
              for o, v in zip(outs, region.outputs)]]
    decls = (*plain("part_ptr", *[f"{o}_ptr" for o in outs]), *a2.decls(), *plain("N", "C_out", "T", "S"),
             constexpr("BLOCK_M"), constexpr("BLOCK_T"), constexpr("BLOCK_N"))
    return "\n".join(["@triton.jit", f"def {stem}_finalize_kernel({signature(decls)}):",
                      docstring(f"Phase 2 of: {doc}"), *[f"    {ln}" for ln in body]]) + "\n", a2


def cost(region: Region, g: Graph, pool: Node) -> str:
    anchor = region.anchor
    x_numel, w_numel = numel(g.shape_of(anchor.args[0])), numel(anchor.args[1].shape)
    flops = 2 * numel(anchor.shape) * w_numel // anchor.shape[1]
    direct = pool.op not in WINDOWED and runs_direct(anchor)  # a windowed pool keeps the GEMM tile (conv_pool_plan)
    x_reads, x_text = (DIRECT_COST if direct else PACKED_COST)[1:]
    moved = 4 * (x_reads * x_numel + w_numel + len(region.outputs) * numel(pool.shape))
    return (f"At the problem's shape: {flops / 1e9:.3g} GFLOP for the conv (times window volume x pooled pixels / "
            f"conv pixels for a windowed pool), {moved / 2 ** 20:.3g} MiB moved ({x_text}; W once, only the pooled "
            f"outputs written).")


POOL_PLAN = ("geo, pool, scheme, cfg, ops, sizes = conv_pool_plan(x, weight, stride, padding, dilation, groups, "
             "kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode)")


def mean_launch(stem: str, kernel: str, a1: KernelArgs, a2: KernelArgs, outs: list[str], region: Region,
                pool_args: list[str]) -> list[str]:
    """Launcher lines of a global mean (after `geo`, `scheme`, `ops`, `sizes` and `S`, the pixels a mean covers):
    the partials of each sample's pixel tiles, then the finalize."""
    return ["cfg = mean_plan(geo, S, scheme)[0]",
            "N, C = geo.out_shape[:2]",
            *mean_outputs(outs, region),
            "# the partials follow the tile (a slot per sample and pixel tile): allocated per launch, then tuned",
            *tuned_lines(kernel, f"{kernel}_launch",
                         ["_, P, T, grid = mean_plan(geo, S, scheme, cfg)",
                          "part = torch.empty((N * T, C), device=x.device, dtype=torch.float64)",
                          "if geo.M:", *indented(call(f"{kernel}[grid]", ["*ops", "part", *a1.params, "*sizes",
                                                                          *pool_args], ["P=P", *TILE_LAUNCH]))],
                         ["part", "T"]),
            *finalize_lines(stem, outs, a2)]


def finalize_lines(stem: str, outs: list[str], a2: KernelArgs) -> list[str]:
    """Launcher lines of a global mean's finalize over the (N * T, C) partials `part`, S pixels a sample."""
    return ["if geo.M:",
            "    bm, bt = finalize_blocks(N, T)",
            *indented(call(f"{stem}_finalize_kernel[(cdiv(N, bm), cdiv(C, 64))]",
                           ["part", *outs, *a2.params, "N", "C", "T", "S"],
                           ["BLOCK_M=bm", "BLOCK_T=bt", "BLOCK_N=64"]))]


def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    anchor, nodes = region.anchor, list(region.nodes)
    if phase_tiled(anchor):
        at = pool_at(nodes)
        return (transposed_generate if nodes[at].op in WINDOWED else transposed_mean_generate)(region, g, stem)
    pool, m_at, form = nodes[pool_at(nodes)], mean_at(nodes), form_of(anchor)
    outs = [f"out{i}" for i in range(len(region.outputs))]
    replaced = ", ".join(n.origin for n in region.nodes)
    doc = f"Fused: {replaced}. {cost(region, g, pool)}"
    registry: dict[str, tuple[str, bool]] = {}
    windowed = pool.op in WINDOWED
    pool_args = ["*pool.args()", "int(divisor_override or 0)", "COUNT_PAD=bool(count_include_pad)"]
    if windowed and m_at is None:  # one kernel: pooled pixels stored
        kernel, args = windowed_kernel(region, stem, doc, outs, registry)
        kernels: tuple[str, ...] = (kernel,)
        lines = ["x = x.contiguous()", *form.prelude, POOL_PLAN,
                 *[f"{o} = torch.empty(pool.out_shape, device=x.device, dtype=x.dtype)" for o in outs],
                 "if pool.M:  # the tile tuned on a GPU's first call at each geometry (kernels/conv.py tuned_conv)",
                 "    def launch(cfg):",
                 *indented("\n".join(indented(call(f"{stem}_kernel[conv_pool_grid(geo, pool, cfg)]",
                                                  ["*ops", *outs, *args.params, "*sizes", *pool_args[:2]],
                                                  [pool_args[2], *TILE_LAUNCH])))),
                 f"    launch(tuned_conv({stem}_kernel, geo, scheme, cfg, x, launch))"]
    elif windowed:  # a windowed pool, then a global mean of its values: per-sample pooled rows, then a finalize
        kernel, a1 = windowed_kernel(region, stem, doc, outs, registry)
        finalize, a2 = finalize_kernel(region, stem, doc, outs, registry)
        kernels = (kernel, finalize)
        lines = ["x = x.contiguous()", *form.prelude, POOL_PLAN,
                 "S = pool.QD * pool.QH * pool.QW  # pooled pixels per sample",
                 *mean_launch(stem, f"{stem}_kernel", a1, a2, outs, region, pool_args)]
    else:  # a global mean of the conv's pixels
        partial, a1 = mean_partial_kernel(region, stem, doc, registry)
        finalize, a2 = finalize_kernel(region, stem, doc, outs, registry)
        kernels = (partial, finalize)
        lines = [*form.head(),
                 "S = geo.OD * geo.OH * geo.OW  # conv pixels per sample",
                 *mean_launch(stem, f"{stem}_partial_kernel", a1, a2, outs, region, [])]
    lines.append(f"return {', '.join(outs)}")
    params = [n for n, _ in registry.values()]  # every kernel's (one registry)
    pool_params = POOL_PARAMS if windowed else []
    src = launcher(f"fused_{stem}", ["x", "weight", *params, *form.geometry, *pool_params], lines, doc)
    call_args = [anchor.args[0], operand_code(anchor.args[1]), *registry, *geometry_code(anchor),
                 *(pool_code(pool) if windowed else [])]
    return RegionCode(kernels, src, (f"{', '.join(region.outputs)} = {call(f'fused_{stem}', call_args)}",))


class ConvPool(RegionKind):
    name = "conv_pool"
    family = "conv"
    at_ops = (*WINDOWED, *MEANS)
    kernel_modules = ("conv", "conv_transpose", "pooling")

    def enters(self, walk: Walk, n: Node) -> bool:
        return pool_after_conv(walk, n) and not reads_outside(walk)

    def joins(self, walk: Walk, n: Node) -> bool:
        """After the pool: pointwise ops on the pooled shape reading pooled values, numbers, per-channel params; after
        a windowed pool, at most one global mean of its values (nothing between read outside); after a global mean,
        ops and views that keep one value per (sample, channel)."""
        members, at = walk.members, pool_at(walk.members)
        m_at = mean_at(members)
        if m_at is None and n.op in MEANS:  # a windowed pool's values, averaged whole per sample and channel
            return (not phase_tiled(walk.anchor) and is_global_mean(n, walk.g)
                    and n.args[0] in {m.name for m in members[at:]} and walk.g.shape_of(n.args[0]) == members[at].shape
                    and read_only_inside(members[at:], n, walk.g))
        return joins_after_pool(members, at if m_at is None else m_at, n)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return generate(region, g, stem)


KIND = ConvPool()
