"""Region kind `gemm_rowreduce`: GEMM -> ops -> ONE reduction or norm over the whole feature row -> ops.

A row of N features spans several column tiles, so no tile sees a whole row: a two-phase scheme, never a
single-tile assumption. Three launches (the third only when a full-width value depends on the row result):
  1. `<name>_kernel`: the GEMM and the full-width ops before the reduction ("pre"); per (row, column tile)
     it stores the tile's partials into a (M, T) buffer (T = column tiles):
        sum, mean                 the tile's sum
        max, min                  the tile's max / min
        logsumexp, (log_)softmax  the tile's max m_t and sum(exp(y - m_t)) (overflow-free)
        LayerNorm, InstanceNorm   the tile's mean and M2 = sum((y - tile mean)^2) (no E[y^2]-E[y]^2 loss)
     and the pre values the apply pass reads, in fp32;
  2. `<name>_finalize_kernel`: per row, merges the T partials (running max rescaling for logsumexp, Chan's
     pairwise update for the moments), then runs the per-row ops after the reduction ("row"), and stores
     the per-row results (M,) the model or the apply pass reads;
  3. `<name>_apply_kernel`: one elementwise pass for the full-width values that read the row result
     ("post"): softmax = exp(y - lse), log_softmax = y - lse, norms (y - mean) * rstd * w + b, and any
     op mixing per-row and full-width values (x - x.mean(1, keepdim=True)).
When the model returns no per-row value, phase 2 runs inside phase 3 (each apply program merges its rows'
partials, T loads per row from L2): two launches, which is what small, launch-bound problems pay for.
Bytes beyond the GEMM: 4 * M * T per partial (T = N / BLOCK_N, tiny), M per row result; for the apply pass
the pre value is written and read once (2 * M * N * 4) and the output written once.
Which phase each op runs in is `row_roles`.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Param, Region
from kfuse.ops import REDUCE_OPS, ROW_NORM_OPS, VIEW_OPS
from kfuse.regions.common import (
    LAUNCH_TAIL,
    KernelArgs,
    RegionCode,
    call,
    gemm_cost,
    gemm_kernel,
    gemm_prologue,
    launcher,
    linear_bias,
    operand_code,
    plain,
    pointwise_kernel,
    pointwise_lines,
    store_line,
    var,
)
from kfuse.regions.kind import RegionKind, Walk, column_operand, numel, per_row_operand, pointwise_with, squeezed
from kfuse.regions.rowstats import (
    PARTIAL_DTYPE,
    PARTIAL_LINES,
    STAT,
    TWO_PARTIALS,
    as_pointwise,
    finalize_kernel,
    merge_lines,
    row_roles,
    row_store_names,
    shape_expr,
)


def over_features(n: Node, g: Graph, anchor: Node) -> bool:
    """Does this reduction / row norm run over the GEMM's feature (last) dim of a full-width value?"""
    x = n.args[0]
    if not isinstance(x, str):
        return False
    shape = g.shape_of(x)
    if squeezed(shape) != squeezed(anchor.shape) or not shape or shape[-1] != anchor.shape[-1]:
        return False
    if n.op in REDUCE_OPS or n.op in ("softmax", "log_softmax"):
        dim = n.attrs.get("dim")
        return isinstance(dim, int) and dim in (-1, len(shape) - 1)
    if n.op == "layer_norm":
        return tuple(n.attrs.get("normalized_shape", ())) == (anchor.shape[-1],) and all(
            a is None or (isinstance(a, Param) and a.shape == (anchor.shape[-1],)) for a in n.args[1:3])
    if n.op == "instance_norm":
        # (M, 1, N): one channel, statistics over N; (M, N) unbatched (C=M, L=N): each row over N, no affine
        if len(shape) == 3 and shape[1] == 1:
            return all(a is None or (isinstance(a, Param) and numel(a.shape) == 1) for a in n.args[1:3])
        return len(shape) == 2 and n.args[1] is None and n.args[2] is None
    return False


def joins_rows(walk: Walk, n: Node) -> bool:
    """Can `n` join a region of this kind with `walk`'s members (one reduction or row norm at most)?"""
    anchor, g = walk.anchor, walk.g
    roles = row_roles(walk.members, g)
    vals = n.value_args()
    if not vals or not all(v in roles for v in vals):
        return False
    n_cols = anchor.shape[-1]
    rows = numel(anchor.shape) // n_cols if n_cols else 0
    reads = {roles[v] for v in vals}
    if n.op in REDUCE_OPS or n.op in ROW_NORM_OPS:
        has_r = any(r == "reduce" for r in roles.values()) or any(m.op in ROW_NORM_OPS for m in walk.members)
        return not has_r and reads == {"pre"} and over_features(n, g, anchor)
    if reads <= {"reduce", "row"}:  # per-row ops: read only per-row values, numbers and one-element parameters
        if numel(n.shape) != rows:
            return False
        ok_arg = per_row_operand
    else:
        if squeezed(n.shape) != squeezed(anchor.shape) or n.shape[-1] != n_cols:
            return False
        ok_arg = lambda a: column_operand(a, n_cols, set(roles))  # noqa: E731
    return n.op in VIEW_OPS or pointwise_with(n, ok_arg)



def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    nodes = list(region.nodes)
    anchor = nodes[0]
    roles = row_roles(nodes, g)
    red = next(n for n in nodes[1:] if n.op in REDUCE_OPS or n.op in ROW_NORM_OPS)
    stat = STAT[red.op]
    y = red.args[0]
    pre = [n for n in nodes[1:] if roles[n.name] == "pre"]
    row = [n for n in nodes if roles[n.name] == "row"]
    post = [n for n in nodes if roles[n.name] == "post"]
    name = stem
    outputs = list(region.outputs)
    by_name = {n.name: n for n in nodes}

    apply_pre = list(dict.fromkeys(
        ([y] if red.op in ROW_NORM_OPS else []) + [a for n in post for a in n.value_args() if roles.get(a) == "pre"]))
    apply_row = list(dict.fromkeys(a for n in post for a in n.value_args() if roles.get(a) in ("reduce", "row")))

    def buf(v: str) -> str:  # the launcher's tensor holding value v
        return f"o_{v}" if v in outputs else f"k_{v}"

    registry: dict[str, tuple[str, bool]] = {}
    replaced = ", ".join(n.origin for n in nodes)

    # 1. the GEMM with the pre ops, partials, stores
    a1 = KernelArgs(registry=registry)
    env: dict[str, str] = {}
    body = linear_bias(anchor, env, a1)
    body += pointwise_lines(as_pointwise(pre), env, a1)
    pre_outs = [v for v in outputs if roles[v] == "pre"]
    keeps = [v for v in apply_pre if v not in outputs]
    body += [store_line(buf(v), env[v]) for v in pre_outs + keeps]
    body.append(f"# partials of {red.origin} over this column tile, per row")
    body += [ln.format(y=env[y]) for ln in PARTIAL_LINES[stat]]
    body.append("T = tl.cdiv(N, BLOCK_N)")
    body.append("tl.store(pa_ptr + offs_m.to(tl.int64) * T + pid_n, part_a, mask=mask_m)")
    if stat in TWO_PARTIALS:
        body.append("tl.store(pb_ptr + offs_m.to(tl.int64) * T + pid_n, part_b, mask=mask_m)")
    k1_outs = [buf(v) for v in pre_outs + keeps] + ["pa", "pb"]
    gemm = gemm_kernel(name, f"Fused: {replaced}. Phase 1: GEMM, ops before {red.origin}, per-tile partials.",
                       k1_outs, a1, body, sm90=False,  # untuned (gemm_prologue): the Triton tile
                       cost=gemm_cost(region, g))

    # 2. finalize: merge partials per row, the per-row ops, per-row stores. When the model returns no per-row
    # value, each apply program merges its rows' partials itself (T loads per row, L2-resident) instead: one
    # launch fewer, which is what small, launch-bound problems pay for (problems/gemm/33).
    post_outs = [v for v in outputs if roles[v] == "post"]
    inline = bool(post) and not any(p.startswith("o_") for p in row_store_names(red, row, outputs, apply_row))
    kernels = [gemm]
    if not inline:
        finalize, row_stores, a2 = finalize_kernel(name, red, row, outputs, apply_row, registry)
        kernels.append(finalize)
    # 3. apply: the full-width ops that read a per-row result
    if post:
        a3 = KernelArgs(registry=registry)
        env3 = {v: var(v) for v in apply_pre}
        stat_ptrs = ["st_a", "st_b"][:2 if stat == "moments" else 1] if red.op in ROW_NORM_OPS else []
        if inline:
            row_ptrs = ["pa", "pb"]
            abody, vals = merge_lines(red, row, a3)
            abody = ["base = offs_m.to(tl.int64) * T", *abody]
            abody += [f"{var(v)} = ({vals[v]}).to(tl.float32)[:, None]" for v in apply_row]
            abody += [f"{p} = {vals[p]}[:, None]" for p in stat_ptrs]
        else:
            row_ptrs = [f"k_{v}" for v in apply_row] + stat_ptrs
            abody = [f"{var(v)} = tl.load(k_{v}_ptr + offs_m, mask=mask_m, other=0.0)[:, None]" for v in apply_row]
            abody += [f"{p} = tl.load({p}_ptr + offs_m, mask=mask_m, other=0.0)[:, None]" for p in stat_ptrs]
        env3.update({v: var(v) for v in apply_row})
        for n in post:
            if n is red:
                yv, out = env3[y], var(n.name)
                if red.op == "softmax":
                    abody.append(f"{out} = tl.exp({yv} - st_a)  # {n.origin}: exp(y - logsumexp)")
                elif red.op == "log_softmax":
                    abody.append(f"{out} = {yv} - st_a  # {n.origin}")
                else:
                    abody.append(f"{out} = ({yv} - st_a) * st_b  # {n.origin}")
                    w, b = n.args[1], n.args[2]
                    if isinstance(w, Param):
                        abody.append(f"{out} = {out} * {a3.operand(w, env3)}")
                    if isinstance(b, Param):
                        abody.append(f"{out} = {out} + {a3.operand(b, env3)}")
                env3[n.name] = out
            else:
                abody += pointwise_lines(as_pointwise([n]), env3, a3)
        abody += [f"tl.store(o_{v}_ptr + tile, {env3[v]}, mask=mask)" for v in post_outs]
        # input pointers are named after the values: pointwise_kernel loads <value>_ptr as v_<value>
        doc = (f"Phases 2 and 3 of {name}: merge the rows' partials ({red.origin}), then the full-width ops."
               if inline else f"Phase 3 of {name}: the full-width ops reading the row result.")
        apply = pointwise_kernel(f"{name}_apply", doc, apply_pre, row_ptrs + [f"o_{v}" for v in post_outs], a3, abody,
                                 extra_sig=plain("T", "TILE_N") if inline else ())
        kernels.append(apply)

    # launcher
    params = [n for n, _ in registry.values()]
    values = list(registry)
    alloc_full = "{} = torch.empty((M, N), device=x.device, dtype={})"
    alloc_row = "{} = torch.empty((M,), device=x.device, dtype={})"
    lines = ["min_block_n = 16", *gemm_prologue(anchor, f"{name}_kernel"),
             "T = cdiv(N, cfg.block_n)",
             f"pa = torch.empty((M, T), device=x.device, dtype={PARTIAL_DTYPE[stat]})",
             "pb = torch.empty_like(pa)" if stat in TWO_PARTIALS else "pb = pa"]
    lines += [alloc_full.format(f"o_{v}", "x.dtype") for v in pre_outs]
    lines += [alloc_full.format(f"k_{v}", "torch.float32") for v in keeps]
    lines.append(call(f"{name}_kernel[grid]", ["*ops", *k1_outs, *a1.params, "M", "N", "k_run", "*strides"],
                      LAUNCH_TAIL))
    if not inline:
        lines += [alloc_row.format(p, "x.dtype" if p.startswith("o_") else "torch.float32") for p in row_stores]
        lines.append(call(f"{name}_finalize_kernel[(cdiv(M, 64),)]", ["pa", "pb", *row_stores, *a2.params, "M", "N",
                                                                        "T", "cfg.block_n", "BLOCK_M=64"]))
    if post:
        lines += [alloc_full.format(f"o_{v}", "x.dtype") for v in post_outs]
        ins = [buf(v) for v in apply_pre]
        lines += ["bm, bn = (32, 128) if interpreting() else (16, 256)",
                  call(f"{name}_apply_kernel[(cdiv(M, bm), cdiv(N, bn))]", ins, row_ptrs, [f"o_{v}" for v in post_outs],
                       a3.params, ["M", "N", *(["T", "cfg.block_n"] if inline else []), "BLOCK_M=bm", "BLOCK_N=bn",
                                   "num_warps=4"])]
    rets = [f"o_{v}.reshape({shape_expr(by_name[v], roles[v] in ('pre', 'post'))})" for v in outputs]
    lines.append("return " + ", ".join(rets))
    doc = f"Fused: {replaced}. Two-phase row {red.op}: per-tile partials, a per-row merge."
    launch = launcher(f"fused_{name}", ["x", "weight", *params], lines, doc)
    weight = anchor.args[1]
    line = f"{', '.join(outputs)} = " + call(f"fused_{name}", [anchor.args[0], operand_code(weight), *values])
    return RegionCode(tuple(kernels), launch, (line,))


class GemmRowReduce(RegionKind):
    name = "gemm_rowreduce"
    family = "gemm"
    at_ops = REDUCE_OPS + ROW_NORM_OPS

    def enters(self, walk: Walk, n: Node) -> bool:
        return walk.tile_2d and (n.op in REDUCE_OPS or n.op in ROW_NORM_OPS) and joins_rows(walk, n)

    def joins(self, walk: Walk, n: Node) -> bool:
        return joins_rows(walk, n)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return generate(region, g, stem)


KIND = GemmRowReduce()
