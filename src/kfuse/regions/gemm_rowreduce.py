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
Which phase each op runs in is `partition.row_roles`.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Param
from kfuse.ops import REDUCE_OPS, ROW_NORM_OPS, VIEW_OPS
from kfuse.partition import Region, row_roles
from kfuse.regions.common import (operand_code, LAUNCH_TAIL, KernelArgs, RegionCode, gemm_kernel, gemm_prologue, kernel_name,
                                  launcher, linear_bias, pointwise_kernel, pointwise_lines, store_line, var)

# The statistic each reduction / row norm needs per tile: one or two partials.
STAT = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min", "logsumexp": "lse", "softmax": "lse",
        "log_softmax": "lse", "layer_norm": "moments", "instance_norm": "moments"}
TWO_PARTIALS = ("lse", "moments")
PARTIAL_DTYPE = {"sum": "torch.float64", "max": "torch.float32", "min": "torch.float32", "lse": "torch.float32",
                 "moments": "torch.float32"}

PARTIAL_LINES = {
    # sums in float64 (into a float64 buffer): no summation rounding at all, only the elements' own
    "sum": ["part_a = tl.sum(tl.where(mask, {y}, 0.0).to(tl.float64), axis=1)"],
    "max": ["part_a = tl.max(tl.where(mask, {y}, float('-inf')), axis=1)"],
    "min": ["part_a = tl.min(tl.where(mask, {y}, float('inf')), axis=1)"],
    "lse": ["part_a = tl.max(tl.where(mask, {y}, float('-inf')), axis=1)",
            "part_b = tl.sum(tl.where(mask, tl.exp({y} - part_a[:, None]), 0.0), axis=1)"],
    "moments": ["t_count = tl.minimum(N - pid_n * BLOCK_N, BLOCK_N).to(tl.float32)",
                "part_a = tl.sum(tl.where(mask, {y}, 0.0), axis=1) / t_count",
                "t_dev = tl.where(mask, {y} - part_a[:, None], 0.0)",
                "part_b = tl.sum(t_dev * t_dev, axis=1)"],
}

# Finalize: merge the T partials of each row. Loads use `t` (the tile) and `base` (the row's first partial).
MERGE_LINES = {
    "sum": ["acc = tl.zeros((BLOCK_M,), dtype=tl.float64)",
            "for t in range(0, T):",
            "    acc += tl.load(pa_ptr + base + t, mask=mask_m, other=0.0)"],
    "max": ["acc = tl.full((BLOCK_M,), float('-inf'), tl.float32)",
            "for t in range(0, T):",
            "    acc = tl.maximum(acc, tl.load(pa_ptr + base + t, mask=mask_m, other=0.0))"],
    "min": ["acc = tl.full((BLOCK_M,), float('inf'), tl.float32)",
            "for t in range(0, T):",
            "    acc = tl.minimum(acc, tl.load(pa_ptr + base + t, mask=mask_m, other=0.0))"],
    "lse": ["m = tl.full((BLOCK_M,), float('-inf'), tl.float32)",
            "s = tl.zeros((BLOCK_M,), dtype=tl.float32)",
            "for t in range(0, T):",
            "    a = tl.load(pa_ptr + base + t, mask=mask_m, other=0.0)",
            "    b = tl.load(pb_ptr + base + t, mask=mask_m, other=0.0)",
            "    m_new = tl.maximum(m, a)",
            "    s = s * tl.exp(m - m_new) + b * tl.exp(a - m_new)",
            "    m = m_new",
            "lse = m + tl.log(s)"],
    "moments": ["count = tl.zeros((BLOCK_M,), dtype=tl.float32)",
                "mean = tl.zeros((BLOCK_M,), dtype=tl.float32)",
                "m2 = tl.zeros((BLOCK_M,), dtype=tl.float32)",
                "for t in range(0, T):",
                "    n_b = tl.minimum(N - t * TILE_N, TILE_N).to(tl.float32)",
                "    mean_b = tl.load(pa_ptr + base + t, mask=mask_m, other=0.0)",
                "    m2_b = tl.load(pb_ptr + base + t, mask=mask_m, other=0.0)",
                "    total = count + n_b",
                "    delta = mean_b - mean",
                "    mean = mean + delta * (n_b / total)",
                "    m2 = m2 + m2_b + delta * delta * (count * n_b / total)",
                "    count = total"],
}
RESULT = {"sum": "acc", "mean": "acc / N", "amax": "acc", "amin": "acc", "logsumexp": "lse"}


def as_pointwise(nodes: list[Node]) -> list[Node]:
    """View ops are identities on a tile: the layout (M, N) row-major is the same."""
    return [n.with_(op="identity", args=(n.args[0],)) if n.op in VIEW_OPS else n for n in nodes]


def shape_expr(n: Node, full: bool) -> str:
    """The node's shape at run time: its first dim is the rows M, a full-width value's last dim is N,
    the dims between are the size-1 dims the views added."""
    dims = ["M"] + [str(d) for d in n.shape[1:]]
    if full and len(n.shape) > 1:
        dims[-1] = "N"
    return ", ".join(dims)


def merge_lines(red: Node, row: list[Node], args: KernelArgs) -> tuple[list[str], dict[str, str]]:
    """Kernel lines merging the (M, T) partials of `red` for the rows offs_m (`base` = offs_m * T), then the
    per-row ops `row`; and the (M,) result of each: the reduction's and the row ops' values by name, or a row
    norm's statistics st_a (logsumexp, or mean) and st_b (1 / sqrt(biased variance + eps))."""
    stat = STAT[red.op]
    env: dict[str, str] = {}
    lines = [ln for ln in MERGE_LINES[stat]]
    if red.op in REDUCE_OPS:
        # the per-row ops run in float64 (M values: free next to the GEMM) and round once, when stored
        lines.append(f"{var(red.name)} = ({RESULT[red.op]}).to(tl.float64)  # {red.origin}")
        env[red.name] = var(red.name)
        lines += pointwise_lines(as_pointwise(row), env, args)
        return lines, env
    if stat == "lse":
        return lines, {"st_a": "lse"}
    lines.append(f"rstd = 1.0 / tl.sqrt(m2 / N + {args.operand(red.args[3], env)})")
    return lines, {"st_a": "mean", "st_b": "rstd"}


def finalize_kernel(name: str, red: Node, row: list[Node], outputs: list[str], apply_row: list[str],
                    registry: dict[str, tuple[str, bool]]) -> tuple[str, list[str], KernelArgs]:
    """Phase 2: `<name>_finalize_kernel` merging the (M, T) partials of `red` per row, then the per-row ops
    `row`; stores the row values in `outputs` (o_<v>) and in `apply_row` (k_<v>, fp32), or a row norm's
    statistics (st_a, st_b). Returns the source, the launcher names of the (M,) tensors it writes (in its
    parameter order, after pa, pb) and its KernelArgs. N is the width the partials cover."""
    a2 = KernelArgs(registry=registry)
    fbody, vals = merge_lines(red, row, a2)
    row_stores = row_store_names(red, row, outputs, apply_row)  # the (M,) tensors the finalize kernel writes
    for p in row_stores:
        fbody.append(f"tl.store({p}_ptr + offs_m, {vals[p[2:] if p[:2] in ('o_', 'k_') else p]}, mask=mask_m)")
    fsig = "".join(f"{p}_ptr, " for p in ["pa", "pb", *row_stores])
    finalize = "\n".join([
        "@triton.jit",
        f"def {name}_finalize_kernel({fsig}{a2.signature()}M, N, T, TILE_N, BLOCK_M: tl.constexpr):",
        f'    """Phase 2 of {name}: merge the column tiles\' partials of each row ({red.origin}), then the '
        'per-row ops."""',
        "    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    mask_m = offs_m < M",
        "    base = offs_m.to(tl.int64) * T",
        *[f"    {ln}" for ln in a2.loads + fbody]]) + "\n"

    return finalize, row_stores, a2


def row_store_names(red: Node, row: list[Node], outputs: list[str], apply_row: list[str]) -> list[str]:
    """The (M,) tensors phase 2 writes, in order: o_<v> for row values the model returns, k_<v> for those the
    apply pass reads, or a row norm's statistics."""
    if red.op not in REDUCE_OPS:
        return ["st_a"] if STAT[red.op] == "lse" else ["st_a", "st_b"]
    names = []
    for v in [red.name, *[n.name for n in row]]:
        names += ([f"o_{v}"] if v in outputs else []) + ([f"k_{v}"] if v in apply_row else [])
    return names


def generate(region: Region, g: Graph) -> RegionCode:
    nodes = list(region.nodes)
    anchor = nodes[0]
    roles = row_roles(nodes, g)
    red = next(n for n in nodes[1:] if n.op in REDUCE_OPS or n.op in ROW_NORM_OPS)
    stat = STAT[red.op]
    y = red.args[0]
    pre = [n for n in nodes[1:] if roles[n.name] == "pre"]
    row = [n for n in nodes if roles[n.name] == "row"]
    post = [n for n in nodes if roles[n.name] == "post"]
    name = kernel_name(region)
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
                       k1_outs, a1, body, sm90=False)  # untuned (gemm_prologue): the Triton tile

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
                                 extra_sig="T, TILE_N, " if inline else "")
        kernels.append(apply)

    # launcher
    params = [n for n, _ in registry.values()]
    values = list(registry)
    alloc_full = "{} = torch.empty((M, N), device=x.device, dtype={})"
    alloc_row = "{} = torch.empty((M,), device=x.device, dtype={})"
    lines = ["min_block_n = 16", *gemm_prologue(anchor),
             "T = cdiv(N, cfg.block_n)",
             f"pa = torch.empty((M, T), device=x.device, dtype={PARTIAL_DTYPE[stat]})",
             "pb = torch.empty_like(pa)" if stat in TWO_PARTIALS else "pb = pa"]
    lines += [alloc_full.format(f"o_{v}", "x.dtype") for v in pre_outs]
    lines += [alloc_full.format(f"k_{v}", "torch.float32") for v in keeps]
    lines.append(f"{name}_kernel[grid](*ops, {''.join(p + ', ' for p in k1_outs)}{''.join(p + ', ' for p in a1.params)}"
                 f"M, N, k_run, *strides, {LAUNCH_TAIL})")
    if not inline:
        lines += [alloc_row.format(p, "x.dtype" if p.startswith("o_") else "torch.float32") for p in row_stores]
        lines.append(f"{name}_finalize_kernel[(cdiv(M, 64),)](pa, pb, {''.join(p + ', ' for p in row_stores)}"
                     f"{''.join(p + ', ' for p in a2.params)}M, N, T, cfg.block_n, BLOCK_M=64)")
    if post:
        lines += [alloc_full.format(f"o_{v}", "x.dtype") for v in post_outs]
        ins = [buf(v) for v in apply_pre]
        lines += ["bm, bn = (32, 128) if interpreting() else (16, 256)",
                  f"{name}_apply_kernel[(cdiv(M, bm), cdiv(N, bn))]("
                  + "".join(p + ", " for p in ins + row_ptrs + [f"o_{v}" for v in post_outs] + a3.params)
                  + f"M, N, {'T, cfg.block_n, ' if inline else ''}BLOCK_M=bm, BLOCK_N=bn, num_warps=4)"]
    rets = [f"o_{v}.reshape({shape_expr(by_name[v], roles[v] in ('pre', 'post'))})" for v in outputs]
    lines.append("return " + ", ".join(rets))
    doc = f"Fused: {replaced}. Two-phase row {red.op}: per-tile partials, a per-row merge."
    launch = launcher(f"fused_{name}", ["x", "weight", *params], lines, doc)
    weight = anchor.args[1]
    call = f"{', '.join(outputs)} = fused_{name}({', '.join([anchor.args[0], operand_code(weight), *values])})"
    return RegionCode(tuple(kernels), launch, (call,))
