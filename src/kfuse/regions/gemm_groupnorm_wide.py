"""Region kind `gemm_groupnorm_wide`: GEMM -> pointwise ops -> GroupNorm whose groups do not fit a column
tile -> pointwise ops.

GroupNorm normalizes each sample's channels in groups of G = N / num_groups. The one-kernel GroupNorm kind needs whole
groups inside a tile (G a power of two <= GROUP_MAX); here G is anything (e.g. 16 groups of 512 channels at N = 8192,
or 3 groups of 43): a group may span several column tiles, and a tile may start inside one group and end
inside the next. No tile sees a whole group, so the statistics are two-phase, as a row norm's are:
  1. `<name>_kernel`: the GEMM and the ops before the norm ("pre"); stores the norm's input y in fp32 (and
     the pre values read later) and, per (row, column tile, slot), the partial moments of the columns of one
     group inside the tile: their mean and M2 = sum((y - that mean)^2) (Welford/Chan form: no
     E[y^2] - E[y]^2 cancellation). Slot s is the tile's s-th group, counted from the group of its first
     column; a tile has `group_slots(BLOCK_N, G)` slots (1 when G is a multiple of BLOCK_N, 2 when a wider
     group may straddle it);
  2. `<name>_finalize_kernel`: per (block of rows, group), merges the partials of the tiles the group
     covers with Chan's pairwise update (counts from the column ranges), and stores mean and
     rstd = 1 / sqrt(M2 / G + eps) (biased variance, as torch) per (row, group);
  3. `<name>_apply_kernel`: one elementwise pass: (y - mean) * rstd [* weight + bias], then the ops after
     the norm ("post"; pre values they read are stored by phase 1, pointwise ops on them are recomputed).
The group count is read from the module when ModelNew runs (G = N // num_groups, N % num_groups checked),
so a ModelNew built with other sizes stays right.
Bytes beyond the GEMM: y written and read once (2 * M * N * 4, the apply pass), plus 2 * 4 * M * T * slots of
partials (T = N / BLOCK_N) and 2 * 4 * M * num_groups of statistics: tiny next to M * N.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Region
from kfuse.regions.common import (
    KEPT,
    SAVE_Z_DOC,
    KernelArgs,
    RegionCode,
    affine_lines,
    call,
    constexpr,
    forward_calls,
    gemm_cost,
    gemm_head,
    gemm_kernel,
    gemm_launch,
    launcher,
    linear_bias,
    names,
    operand_code,
    plain,
    pointwise_kernel,
    pointwise_lines,
    store_line,
    tuned_launch_lines,
    var,
)
from kfuse.regions.kind import EpilogueKind, Walk, group_size, norm_of_tile, whole_groups_in_tile
from kfuse.regions.rowstats import as_pointwise

# Phase 1, after the pre ops: the partial moments of each group slot of this tile. `{y}` is the norm's input.
# A slot's count is the width of (its group's columns) & (this tile's columns) & [0, N): a scalar per tile.
PARTIAL_LINES = (
    "T = tl.cdiv(N, BLOCK_N)",
    "col0 = pid_n * BLOCK_N",
    "g_first = col0 // GROUP  # the group of the tile's first column: slot 0",
    "g_local = offs_n // GROUP - g_first",
    "part = (offs_m.to(tl.int64) * T + pid_n) * SLOTS",
    "for s in tl.static_range(SLOTS):",
    "    s_lo = tl.maximum((g_first + s) * GROUP, col0)",
    "    s_hi = tl.minimum(tl.minimum((g_first + s + 1) * GROUP, col0 + BLOCK_N), N)",
    "    s_count = tl.maximum(s_hi - s_lo, 1).to(tl.float32)  # an empty slot is stored but never merged",
    "    s_in = mask & (g_local == s)[None, :]",
    "    s_mean = tl.sum(tl.where(s_in, {y}, 0.0), axis=1) / s_count",
    "    s_dev = tl.where(s_in, {y} - s_mean[:, None], 0.0)",
    "    tl.store(pa_ptr + part + s, s_mean, mask=mask_m)",
    "    tl.store(pb_ptr + part + s, tl.sum(s_dev * s_dev, axis=1), mask=mask_m)",
)

# Above this many slots per tile (groups narrower than about a third of the tile: 16 slots for groups of 9 in a
# 128-wide tile), phase 1's masked reductions cost more than reading y once more: phase 1 then writes no
# partials and phase 2 computes each group's moments from y (FROM_Y_LINES). Measured on problem 43
# (benchmarks/groupnorm/NOTES.md): phase 1 with 16 slots 1.13 ms against ~0.72 for the plain GEMM.
NARROW_SLOTS = 2

# Phase 2: merge the tiles t0..t1 that group g covers. Tile t holds g in slot g - (first group of t).
MERGE_LINES = (
    "g = tl.program_id(1)",
    "g_lo = g * GROUP",
    "count = tl.zeros((BLOCK_M,), dtype=tl.float32)",
    "mean = tl.zeros((BLOCK_M,), dtype=tl.float32)",
    "m2 = tl.zeros((BLOCK_M,), dtype=tl.float32)",
    "for t in range(g_lo // TILE_N, (g_lo + GROUP - 1) // TILE_N + 1):",
    "    n_b = (tl.minimum(g_lo + GROUP, (t + 1) * TILE_N) - tl.maximum(g_lo, t * TILE_N)).to(tl.float32)",
    "    at = (offs_m.to(tl.int64) * T + t) * SLOTS + (g - (t * TILE_N) // GROUP)",
    "    mean_b = tl.load(pa_ptr + at, mask=mask_m, other=0.0)",
    "    m2_b = tl.load(pb_ptr + at, mask=mask_m, other=0.0)",
    "    total = count + n_b",
    "    delta = mean_b - mean",
    "    mean = mean + delta * (n_b / total)",
    "    m2 = m2 + m2_b + delta * delta * (count * n_b / total)",
    "    count = total",
)

# Phase 3: each column's group statistics, gathered per element of the tile.
APPLY_LOADS = (
    "g_at = offs_m[:, None].to(tl.int64) * NUM_GROUPS + (offs_n // GROUP)[None, :]",
    "g_mean = tl.load(g_mean_ptr + g_at, mask=mask, other=0.0)",
    "g_rstd = tl.load(g_rstd_ptr + g_at, mask=mask, other=0.0)",
)


def phases(nodes: list[Node], norm: Node, outputs: list[str]) -> tuple[list[Node], list[Node]]:
    """(pre, post) members after the anchor. pre: what phase 1 must compute, the norm's input and the values
    read outside the region that do not depend on the norm, with what they read. post: the rest (the norm,
    the ops after it, and ops on pre values read only by those): the apply pass recomputes them from stored
    values, which costs no bytes, where storing them would cost a write and a read of M x N."""
    by_name = {n.name: n for n in nodes}
    after = {norm.name}
    for n in nodes:
        if after & set(n.value_args()):
            after.add(n.name)
    need: set[str] = set()
    todo = [norm.args[0], *[v for v in outputs if v not in after]]
    while todo:
        v = todo.pop()
        if v in by_name and v not in need:
            need.add(v)
            todo += by_name[v].value_args()
    return [n for n in nodes[1:] if n.name in need], [n for n in nodes[1:] if n.name not in need]


def norm_lines(norm: Node, y: str, env: dict[str, str], args: KernelArgs) -> list[str]:
    """Apply-pass lines: the normalized value of `norm` from its input variable `y` and g_mean / g_rstd."""
    _x, _groups, weight, bias, _eps = norm.args
    out = var(norm.name)
    lines = [f"{out} = ({y} - g_mean) * g_rstd  # {norm.origin}", *affine_lines(out, weight, bias, env, args)]
    env[norm.name] = out
    return lines


# Phase 2 for groups narrower than a tile (phase 1 wrote no partials: SLOTS = 0): each (row, group)'s moments
# straight from y, the group's G columns in one masked [BLOCK_M, GP] tile (two-pass: mean, then M2).
FROM_Y_LINES = (
    "g = tl.program_id(1)",
    "offs_g = tl.arange(0, GP)",
    "in_g = mask_m[:, None] & (offs_g < GROUP)[None, :]",
    "yv = tl.load(y_ptr + offs_m[:, None].to(tl.int64) * N + (g * GROUP + offs_g)[None, :], mask=in_g, other=0.0)",
    "mean = tl.sum(yv, axis=1) / GROUP",
    "dev = tl.where(in_g, yv - mean[:, None], 0.0)",
    "m2 = tl.sum(dev * dev, axis=1)",
)


def finalize_kernel(name: str, norm: Node, args: KernelArgs) -> str:
    """Phase 2 source: per (row, group), merge the tiles' partials (FROM_Y false) or read the group's columns of
    y (FROM_Y true, narrow groups), then store mean and rstd (M, num_groups)."""
    eps = args.operand(norm.args[4], {})
    body = ["if FROM_Y:", *[f"    {ln}" for ln in FROM_Y_LINES], "else:", *[f"    {ln}" for ln in MERGE_LINES],
            f"rstd = 1.0 / tl.sqrt(m2 / GROUP + {eps})  # biased variance, as torch",
            "out = offs_m.to(tl.int64) * NUM_GROUPS + g",
            "tl.store(g_mean_ptr + out, mean, mask=mask_m)",
            "tl.store(g_rstd_ptr + out, rstd, mask=mask_m)"]
    return "\n".join([
        "@triton.jit",
        "def " + call(f"{name}_finalize_kernel", ["pa_ptr", "pb_ptr", "y_ptr", "g_mean_ptr", "g_rstd_ptr"],
                      names(args.decls()), ["M", "N", "T", "TILE_N", "SLOTS", "GROUP", "NUM_GROUPS"],
                      ["BLOCK_M: tl.constexpr", "FROM_Y: tl.constexpr", "GP: tl.constexpr"]) + ":",
        f'    """Phase 2 of {name}: the moments of each (row, group) from the column tiles\' partials, or from '
        f'y for groups narrower than a tile ({norm.origin})."""',
        "    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    mask_m = offs_m < M",
        *[f"    {ln}" for ln in args.loads + body]]) + "\n"


def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    nodes = list(region.nodes)
    anchor = nodes[0]
    norm = next(n for n in nodes if n.op == "group_norm")
    y = norm.args[0]
    outputs = list(region.outputs)
    pre, post = phases(nodes, norm, outputs)
    post_names = {n.name for n in post}
    name = stem
    pre_outs = [v for v in outputs if v not in post_names]
    post_outs = [v for v in outputs if v in post_names]
    # pre values the apply pass reads: the norm's input and any other one a post op reads
    apply_in = list(dict.fromkeys([y] + [a for n in post for a in n.value_args() if a not in post_names]))
    keeps = [v for v in apply_in if v not in outputs]  # kept in fp32 for the apply pass only

    def buf(v: str) -> str:  # the launcher's tensor holding pre value v
        return f"o_{v}" if v in outputs else f"k_{v}"

    registry: dict[str, tuple[str, bool]] = {}
    replaced = ", ".join(n.origin for n in nodes)

    # 1. the GEMM, the pre ops, their stores, the partial moments
    a1, env1 = KernelArgs(registry=registry), {}
    body = linear_bias(anchor, env1, a1) + pointwise_lines(as_pointwise(pre), env1, a1)
    body += [store_line(buf(v), env1[v]) for v in pre_outs + keeps]
    body.append(f"# partial moments of {norm.origin}: per row and per group slot of this column tile")
    body += [ln.format(y=env1[y]) for ln in PARTIAL_LINES]
    k1_outs = [buf(v) for v in pre_outs + keeps] + ["pa", "pb"]
    gemm = gemm_kernel(name, f"Fused: {replaced}. Phase 1: GEMM, ops before {norm.origin}, partial moments per "
                       "(row, column tile, group slot).", k1_outs, a1, body, (*plain("GROUP"), constexpr("SLOTS")),
                       z_var=var(anchor.name), cost=gemm_cost(region, g))

    # 2. finalize
    a2 = KernelArgs(registry=registry)
    finalize = finalize_kernel(name, norm, a2)

    # 3. apply
    a3 = KernelArgs(registry=registry)
    env3 = {v: var(v) for v in apply_in}
    abody = [*APPLY_LOADS, *norm_lines(norm, env3[y], env3, a3)]
    abody += pointwise_lines(as_pointwise([n for n in post if n is not norm]), env3, a3)
    abody += [f"tl.store(o_{v}_ptr + tile, {env3[v]}, mask=mask)" for v in post_outs]
    # input pointers are named after the values: pointwise_kernel loads <value>_ptr as v_<value>
    apply = pointwise_kernel(f"{name}_apply", f"Phase 3 of {name}: normalize with the group statistics, then "
                             "the ops after the norm.", apply_in, ["g_mean", "g_rstd", *[f"o_{v}" for v in post_outs]],
                             a3, abody, extra_sig=plain("GROUP", "NUM_GROUPS"))

    # launcher: group size from the module's num_groups at call time; tuning may pick any column tile
    params = [n for n, _ in registry.values()]
    full = "{} = torch.empty((M, N), device=x.device, dtype={})"
    results = [buf(v) for v in pre_outs + keeps] + ["pa", "pb", "z", "ops"]
    launch_body = [
        "T, slots = cdiv(N, cfg.block_n), group_slots(cfg.block_n, group)",
        f"slots = 0 if slots > {NARROW_SLOTS} else slots  # narrow groups: no partials, phase 2 reads y",
        "pa = torch.empty((M, T, max(slots, 1)), device=x.device, dtype=torch.float32)",
        "pb = torch.empty_like(pa)",
        *[full.format(f"o_{v}", "x.dtype") for v in pre_outs],
        *[full.format(f"k_{v}", "torch.float32") for v in keeps],
        "z = torch.empty((M, N), device=x.device, dtype=x.dtype) if save_z else pa  # unused if not",
        gemm_launch(name, ["*ops", *k1_outs, "z", *a1.params, "M", "N", "k_run", "*strides", "group", "SLOTS=slots",
                           "STORE_Z=save_z"])]
    lines = [
        "min_block_n = 16",
        *gemm_head(anchor),
        "if groups <= 0 or N % groups:",
        "    raise ValueError(f'GroupNorm: {N} channels are not divisible into {groups} groups')",
        "group = N // groups",
        *tuned_launch_lines(anchor, name, launch_body, results),
        "T, slots = pa.shape[1], pa.shape[2]",
        f"from_y = group_slots(cfg.block_n, group) > {NARROW_SLOTS}",
        "g_mean = torch.empty((M, groups), device=x.device, dtype=torch.float32)",
        "g_rstd = torch.empty_like(g_mean)",
        call(f"{name}_finalize_kernel[(cdiv(M, 64), groups)]", ["pa", "pb", buf(y), "g_mean", "g_rstd"], a2.params,
             ["M", "N", "T", "cfg.block_n", "slots", "group", "groups", "BLOCK_M=64", "FROM_Y=from_y",
              "GP=triton.next_power_of_2(group) if from_y else 1"]),
        *[full.format(f"o_{v}", "x.dtype") for v in post_outs],
        "bm, bn = (32, 128) if interpreting() else (16, 256)",
        call(f"{name}_apply_kernel[(cdiv(M, bm), cdiv(N, bn))]", [buf(v) for v in apply_in], ["g_mean", "g_rstd"],
             [f"o_{v}" for v in post_outs], a3.params, ["M", "N", "group", "groups", "BLOCK_M=bm", "BLOCK_N=bn",
                                                        "num_warps=4"]),
        "shaped = (" + "".join(f"o_{v}.reshape(*lead, N), " for v in outputs) + ")",
        "if save_z:",
        f"    return (*shaped, {KEPT})",
        "return shaped if len(shaped) > 1 else shaped[0]",
    ]
    doc = (f"Fused: {replaced}. GroupNorm over groups wider than (or straddling) a column tile: per-tile partial "
           "moments, a per-(row, group) Chan merge, one apply pass.")
    launch = launcher(f"fused_{name}", ["x", "weight", "groups", *params, "save_z=False"], lines,
                      f"{doc} {SAVE_Z_DOC}")
    weight = anchor.args[1]
    call_args = [anchor.args[0], operand_code(weight), f"int({norm.args[1].expr()})", *registry]
    return forward_calls(region, f"fused_{name}", call_args, launch, (gemm, finalize, apply))


class GemmGroupNormWide(EpilogueKind):
    name = "gemm_groupnorm_wide"
    family = "gemm"
    at_ops = ("group_norm",)

    def enters(self, walk: Walk, n: Node) -> bool:
        """A GroupNorm over the GEMM's columns whose groups a column tile does not hold whole."""
        size = group_size(n, walk.anchor.shape[-1]) if norm_of_tile(walk, n, "group_norm") else None
        return size is not None and not whole_groups_in_tile(size)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return generate(region, g, stem)


KIND = GemmGroupNormWide()
