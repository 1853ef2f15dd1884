"""Row statistics in two phases, shared by the kinds whose reduction spans column tiles (a row reduction or
row norm over the GEMM's features, a reduction of pooled features, GroupNorm groups wider than a tile, GEMV rows).

Phase 1 (the GEMM kernel's epilogue) stores per (row, column tile) partials of a statistic; phase 2
(`<name>_finalize_kernel`) merges a row's T partials (running max rescaling for logsumexp, Chan's pairwise update
for the moments), runs the per-row ops after the reduction and stores the per-row results.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node
from kfuse.ops import REDUCE_OPS, ROW_NORM_OPS, VIEW_OPS
from kfuse.regions.common import KernelArgs, names, plain, pointwise_lines, signature, var

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
    fsig = [f"{p}_ptr" for p in ["pa", "pb", *row_stores]]
    finalize = "\n".join([
        "@triton.jit",
        f"def {name}_finalize_kernel({signature(plain(*fsig, *names(a2.decls()), 'M', 'N', 'T', 'TILE_N'))}, "
        "BLOCK_M: tl.constexpr):",
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


def row_roles(nodes: list[Node], g: Graph) -> dict[str, str]:
    """The phase of each member of a two-phase region (anchor first, one reduction or row norm R):
      pre    full-width values not depending on R: computed in the GEMM's (or convolution's) epilogue
      reduce R itself when it is a reduction (a per-row value), made by the finalize kernel from partials
      row    per-row values computed from R (finalize kernel)
      post   full-width values depending on R, and R itself when it is a row norm (apply kernel)"""
    roles: dict[str, str] = {}
    for i, n in enumerate(nodes):
        reads = {roles[a] for a in n.value_args() if a in roles}
        if i == 0:
            roles[n.name] = "pre"
        elif n.op in REDUCE_OPS:
            roles[n.name] = "reduce"
        elif n.op in ROW_NORM_OPS:
            roles[n.name] = "post"
        elif reads <= {"reduce", "row"}:
            roles[n.name] = "row"
        elif reads == {"pre"}:
            roles[n.name] = "pre"
        else:
            roles[n.name] = "post"
    return roles
