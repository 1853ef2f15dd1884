"""Region kind `gemm_pool`: GEMM -> ops -> MaxPool1d / AvgPool1d over the features -> ops, one kernel.

`pool(y.unsqueeze(1)).squeeze(1)` with non-overlapping windows of k features (stride k, no padding, floor)
is a reduction inside the column tile when k is a power of two: the tile (BLOCK_M, BLOCK_N) holds whole
windows (BLOCK_N is a power of two >= k), so reshape it to (BLOCK_M, BLOCK_N / k, k) and take the max or the
mean over the last axis, as GroupNorm does with its groups. The pooled tile covers output columns
pid_n * BLOCK_N / k + [0, BLOCK_N / k); windows torch drops (the last N % k features) are masked out.
Bytes: the GEMM's, with the output k times narrower: M * N / k * 4 written instead of M * N * 4 + a pass.
The ops after the pool run on the pooled tile (numbers and one-element parameters only). A reduction over
the pooled features (maxpool -> sum, avgpool -> gelu -> max) is two-phase (regions/rowstats.py): per-tile
partials of the pooled tile, then `<name>_finalize_kernel` merges them per row and runs the per-row ops.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Region, Scalar
from kfuse.ops import POOL_OPS, REDUCE_OPS, VIEW_OPS
from kfuse.regions.common import (
    LAUNCH_TAIL,
    KernelArgs,
    RegionCode,
    call,
    constexpr,
    gemm_cost,
    gemm_kernel,
    gemm_prologue,
    launcher,
    linear_bias,
    operand_code,
    plain,
    pointwise_lines,
    store_line,
    var,
)
from kfuse.regions.kind import RegionKind, Walk, per_row_operand, pointwise_with, squeezed
from kfuse.regions.rowstats import PARTIAL_DTYPE, PARTIAL_LINES, STAT, TWO_PARTIALS, finalize_kernel, shape_expr

POOL_MAX = 64  # widest pooling window fused into one column tile


def pool_fits(walk: Walk, n: Node) -> bool:
    """A pool over the features of an (M, 1, N) view of the region, windows a power of two <= POOL_MAX."""
    if n.op not in POOL_OPS or not walk.tile_2d or len(n.args) < 2:
        return False
    x, k = n.args[0], n.args[1]
    if not isinstance(x, str) or x not in walk.values or not isinstance(k, Scalar):
        return False
    k = int(k.value)
    rows, n_cols = walk.anchor.shape
    return (walk.g.shape_of(x) == (rows, 1, n_cols) and n.shape == (rows, 1, n_cols // k) and 0 < k <= POOL_MAX
            and k & (k - 1) == 0 and n_cols // k > 0)


def _on_pooled(n: Node, values: set[str], width: int, rows: int) -> bool:
    """Ops on the pooled values: views, and pointwise ops with numbers and one-element parameters."""
    vals = n.value_args()
    if not vals or not all(v in values for v in vals) or squeezed(n.shape) != squeezed((rows, width)):
        return False
    return n.op in VIEW_OPS or pointwise_with(n, per_row_operand)


def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    nodes = list(region.nodes)
    anchor = nodes[0]
    at = next(i for i, n in enumerate(nodes) if n.op in POOL_OPS)
    pool = nodes[at]
    red_at = next((i for i, n in enumerate(nodes) if i > at and n.op in REDUCE_OPS), len(nodes))
    pre, post, row = nodes[1:at], nodes[at + 1:red_at], nodes[red_at + 1:]
    red = nodes[red_at] if red_at < len(nodes) else None
    outputs = list(region.outputs)
    pre_outs = [v for v in outputs if any(n.name == v for n in nodes[:at])]
    post_outs = [v for v in outputs if any(n.name == v for n in nodes[at:red_at])]
    name = stem
    args = KernelArgs()
    env: dict[str, str] = {}
    body = linear_bias(anchor, env, args)
    body += pointwise_lines(pre, env, args)
    body += [store_line(f"o_{v}", env[v]) for v in pre_outs]
    y, out = env[pool.args[0]], var(pool.name)
    if pool.op == "max_pool1d":
        body += [f"# {pool.origin}: the max of each window of POOL consecutive features",
                 f"pw = tl.reshape(tl.where(mask_n[None, :], {y}, float('-inf')), (BLOCK_M, BLOCK_N // POOL, POOL))",
                 f"{out} = tl.max(pw, axis=2)"]
    else:
        body += [f"# {pool.origin}: the mean of each window of POOL consecutive features",
                 f"pw = tl.reshape(tl.where(mask_n[None, :], {y}, 0.0), (BLOCK_M, BLOCK_N // POOL, POOL))",
                 f"{out} = tl.sum(pw, axis=2) / POOL"]
    env[pool.name] = out
    body += ["offs_p = pid_n * (BLOCK_N // POOL) + tl.arange(0, BLOCK_N // POOL)",
             "mask_p = mask_m[:, None] & (offs_p < N_OUT)[None, :]"]
    body += pointwise_lines(post, env, args)
    body += [f"tl.store(o_{v}_ptr + offs_m[:, None].to(tl.int64) * N_OUT + offs_p[None, :], {env[v]}, mask=mask_p)"
             for v in post_outs]
    replaced = ", ".join(n.origin for n in nodes)
    outs = [f"o_{v}" for v in pre_outs + post_outs]
    kernels: list[str] = []
    if red is not None:  # per-tile partials of the pooled row, merged per row by the finalize kernel
        stat = STAT[red.op]
        body.append(f"# partials of {red.origin} over this tile's pooled features, per row")
        body += [ln.format(y=env[red.args[0]]).replace("mask", "mask_p") for ln in PARTIAL_LINES[stat]]
        body += ["T = tl.cdiv(N, BLOCK_N)",
                 "tl.store(pa_ptr + offs_m.to(tl.int64) * T + pid_n, part_a, mask=mask_m)"]
        if stat in TWO_PARTIALS:
            body.append("tl.store(pb_ptr + offs_m.to(tl.int64) * T + pid_n, part_b, mask=mask_m)")
        outs += ["pa", "pb"]
        finalize, row_stores, a2 = finalize_kernel(name, red, row, outputs, [], args.registry)
        kernels.append(finalize)
    doc = f"Fused: {replaced}. Column tiles hold whole pooling windows of POOL features."
    kernel = gemm_kernel(name, doc, outs, args, body, extra_sig=(*plain("N_OUT"), constexpr("POOL")), sm90=False,
                         cost=gemm_cost(region, g))
    kernels.insert(0, kernel)
    by_name = {n.name: n for n in nodes}

    def post_shape(v: str) -> str:
        dims = ["M"] + [str(d) for d in by_name[v].shape[1:]]
        if len(dims) > 1:
            dims[-1] = "N_OUT"
        return ", ".join(dims)

    # The window is read from the module (or the call's literal) at run time, as GroupNorm's groups are.
    lines = ["pool = int(kernel)",
             "if pool <= 0 or pool & (pool - 1) or pool > 64:",
             "    raise ValueError(f'fused pooling needs a power-of-two window <= 64, got {pool}')",
             "min_block_n = max(16, pool)",
             *gemm_prologue(anchor, f"{name}_kernel"),
             "N_OUT = N // pool"]
    lines += [f"o_{v} = torch.empty((M, N), device=x.device, dtype=x.dtype)" for v in pre_outs]
    lines += [f"o_{v} = torch.empty((M, N_OUT), device=x.device, dtype=x.dtype)" for v in post_outs]
    if red is not None:
        lines += ["T = cdiv(N, cfg.block_n)",
                  f"pa = torch.empty((M, T), device=x.device, dtype={PARTIAL_DTYPE[STAT[red.op]]})",
                  "pb = torch.empty_like(pa)" if STAT[red.op] in TWO_PARTIALS else "pb = pa"]
    lines.append(call(f"{name}_kernel[grid]", ["*ops", *outs, *args.params, "M", "N", "k_run", "*strides", "N_OUT",
                                               "POOL=pool"], LAUNCH_TAIL))
    if red is not None:  # the partials cover N_OUT pooled features
        lines += [f"{p} = torch.empty((M,), device=x.device, "
                  f"dtype={'x.dtype' if p.startswith('o_') else 'torch.float32'})"
                  for p in row_stores]
        lines.append(call(f"{name}_finalize_kernel[(cdiv(M, 64),)]", ["pa", "pb", *row_stores, *a2.params],
                          ["M", "N_OUT", "T", "cfg.block_n // pool", "BLOCK_M=64"]))
    rets = [f"o_{v}.reshape({shape_expr(by_name[v], True)})" for v in pre_outs]
    rets += [f"o_{v}.reshape({post_shape(v)})" if v in post_outs else f"o_{v}.reshape({shape_expr(by_name[v], False)})"
             for v in outputs if v not in pre_outs]
    lines.append("return " + ", ".join(rets))
    # every kernel's parameters (the finalize kernel's per-row ops may read numbers the GEMM kernel does not)
    params, values = [n for n, _ in args.registry.values()], list(args.registry)
    launch = launcher(f"fused_{name}", ["x", "weight", "kernel", *params], lines, doc)
    weight = anchor.args[1]
    call_args = [anchor.args[0], operand_code(weight), pool.args[1].expr(), *values]
    return RegionCode(tuple(kernels), launch, (f"{', '.join(outputs)} = " + call(f"fused_{name}", call_args),))


class GemmPool(RegionKind):
    name = "gemm_pool"
    family = "gemm"
    at_ops = POOL_OPS

    def enters(self, walk: Walk, n: Node) -> bool:
        return pool_fits(walk, n)

    def joins(self, walk: Walk, n: Node) -> bool:
        """After the pool: ops on the pooled values, at most one reduction over the pooled features, then
        per-row ops on its result."""
        at = next(i for i, m in enumerate(walk.members) if m.op in POOL_OPS)
        width, rows = walk.members[at].shape[-1], walk.anchor.shape[0]
        red = next((i for i in range(at + 1, len(walk.members)) if walk.members[i].op in REDUCE_OPS), None)
        if red is not None:  # after the reduction of the pooled row: per-row ops
            return _on_pooled(n, {m.name for m in walk.members[red:]}, 1, rows)
        pooled = {m.name for m in walk.members[at:]}
        if n.op in REDUCE_OPS and n.args[0] in pooled:  # per-tile partials, a finalize
            x_shape = walk.g.shape_of(n.args[0])
            return squeezed(x_shape) == squeezed((rows, width)) and n.attrs.get("dim") in (-1, len(x_shape) - 1)
        return _on_pooled(n, pooled, width, rows)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return generate(region, g, stem)


KIND = GemmPool()
