"""Stage 4, partition: group the graph's nodes into regions, each of which becomes one launcher.

A GEMM (nn.Linear, F.linear, or `x @ W` against a 2-d parameter) anchors a region; the ops after it join
while every value they read is the region's own, a scalar, or a per-column parameter:
  - pointwise ops (the table in ops.py)                        -> kind `gemm_epilogue`
  - GroupNorm over the GEMM's columns, groups a power of two
    no wider than GROUP_MAX (a column tile holds whole groups)  -> kind `gemm_groupnorm`
  - GroupNorm with any other group size (groups span or straddle
    column tiles, or are narrower than a third of one): per-tile
    partials or (narrow groups) none, per-(row, group) moments,
    an apply pass                                                 -> kind `gemm_groupnorm_wide`
  - BatchNorm1d over the GEMM's output                         -> kind `gemm_batchnorm`
    (ops after it must read only values after it: they run in the apply pass)
  - MaxPool1d / AvgPool1d over the features of x.unsqueeze(1), non-overlapping windows of a power-of-two
    k <= POOL_MAX, then ops with numbers on the pooled values, and at most one reduction over the
    pooled features with per-row ops after it                  -> kind `gemm_pool`
  - one reduction over the GEMM's features (sum, mean, max, min, logsumexp) or one norm over them
    (softmax, log_softmax, LayerNorm, InstanceNorm over the features), then ops on the per-row result
    and/or full-width ops reading it                          -> kind `gemm_rowreduce` (see row_roles)
    View ops that only add or remove size-1 dims join as identities.
The sum (or mean) of a whole GEMM output is rewritten to a GEMV first (rewrite.py): node `linear_rowsum`
anchors a region of kind `gemv`, with the per-row ops after it.
Every other node is a region of kind `torch` on its own: it stays a torch call in ModelNew and is listed
in the report's `unfused_ops`; a host value (a tensor's sizes, arithmetic on them) or a view (a transpose) is a
region of kind `view`: no kernel, not listed there.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfuse.ir import Graph, Node, Param, Scalar
from kfuse.ops import POINTWISE, POOL_OPS, REDUCE_OPS, ROW_NORM_OPS, VIEW_OPS

GROUP_MAX = 128  # widest group (channels) fused into one column tile: on an H100 no 256-wide tile config of
# the fp16x3p GroupNorm kernel compiled (kfuse autotune: "no config ran", problem 27, 1024x8192x8192), so wider
# groups take the two-phase kind
POOL_MAX = 64  # widest pooling window fused into one column tile


# "torch": a torch call as written; "view": no kernel at all: a host value (a tensor's sizes) or a view sharing a
# tensor's storage (a transpose: the GEMM reads it through strides)
UNFUSED_KINDS = ("torch", "view")
NO_KERNEL_OPS = ("shape", "alias")


@dataclass(frozen=True)
class Region:
    kind: str
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]  # values read after the region (by other regions or as model outputs)

    @property
    def anchor(self) -> Node:
        return self.nodes[0]

    def ops(self) -> list[str]:
        return [n.op for n in self.nodes]

    @property
    def fused(self) -> bool:
        return self.kind not in UNFUSED_KINDS


def is_gemm_anchor(n: Node, g: Graph) -> bool:
    if n.op == "linear":
        x, w = n.args[0], n.args[1]
        w_shape = w.shape if isinstance(w, Param) else g.shape_of(w) if isinstance(w, str) else ()
        return isinstance(x, str) and len(w_shape) == 2 and all(n.shape) and (
            len(n.args) < 3 or n.args[2] is None or isinstance(n.args[2], Param))
    if n.op == "matmul":  # x @ W with W a 2-d parameter or value (a @ b of two inputs, a 3-d or 4-d tensor @ b)
        x, w = n.args
        w_shape = w.shape if isinstance(w, Param) else g.shape_of(w) if isinstance(w, str) else ()
        if n.attrs.get("batched"):  # bmm, or x[..., M, K] @ w[..., K, N] with the same leading dims
            x_shape = g.shape_of(x)
            return isinstance(w, str) and x_shape[:-2] == w_shape[:-2] and all(n.shape)
        return isinstance(x, str) and len(g.shape_of(x)) >= 2 and len(w_shape) == 2 and all(n.shape)
    if n.op == "linear_rowsum":
        x = n.args[0]
        return isinstance(x, str) and len(g.shape_of(x)) == 2
    return False


def _column_operand(a: object, n_cols: int, values: set[str]) -> bool:
    """Can a fused pointwise op read this operand? Region values, numbers, per-column or 1-element params."""
    if isinstance(a, str):
        return a in values
    if isinstance(a, Scalar):
        return True
    if isinstance(a, Param):
        return (len(a.shape) >= 1 and a.shape[-1] == n_cols and all(d == 1 for d in a.shape[:-1])) or all(
            d == 1 for d in a.shape)
    return False


def group_norm_kind(n: Node, n_cols: int) -> str | None:
    """The region kind a GroupNorm over `n_cols` channels makes, or None when it stays a torch call:
    whole groups inside a column tile (a power of two <= GROUP_MAX) -> one kernel; any other group size -> the
    two-phase kind (group sizes read again at run time by both)."""
    groups = n.args[1]
    if not isinstance(groups, Scalar) or groups.value <= 0 or n_cols % int(groups.value):
        return None
    size = n_cols // int(groups.value)
    if size <= GROUP_MAX and size & (size - 1) == 0:
        return "gemm_groupnorm"
    return "gemm_groupnorm_wide"


def _joins(n: Node, kind: str, anchor: Node, values: set[str]) -> str | None:
    """The region kind after `n` joins, or None if it cannot."""
    if n.op in VIEW_OPS:  # size-1 dims added or removed: the same values (kept only if a reduction follows)
        return kind if n.args[0] in values and _squeezed(n.shape) == _squeezed(anchor.shape) else None
    if n.shape != anchor.shape or not n.value_args():
        return None
    n_cols = anchor.shape[-1]
    if n.op in POINTWISE:
        ok = len(n.args) == POINTWISE[n.op].arity and all(_column_operand(a, n_cols, values) for a in n.args)
        return kind if ok else None
    if kind != "gemm_epilogue" or len(anchor.shape) != 2 or n.args[0] not in values:
        return None  # one norm per region, over a 2-d GEMM output
    if n.op == "group_norm" and group_norm_kind(n, n_cols) and all(
            a is None or (isinstance(a, Param) and a.shape == (n_cols,)) for a in n.args[2:4]):
        return group_norm_kind(n, n_cols)
    if n.op == "batch_norm":
        return "gemm_batchnorm"
    return None


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _over_features(n: Node, g: Graph, anchor: Node) -> bool:
    """Does this reduction / row norm run over the GEMM's feature (last) dim of a full-width value?"""
    x = n.args[0]
    if not isinstance(x, str):
        return False
    shape = g.shape_of(x)
    if _squeezed(shape) != _squeezed(anchor.shape) or not shape or shape[-1] != anchor.shape[-1]:
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
            return all(a is None or (isinstance(a, Param) and _numel(a.shape) == 1) for a in n.args[1:3])
        return len(shape) == 2 and n.args[1] is None and n.args[2] is None
    return False


def row_roles(nodes: list[Node], g: Graph) -> dict[str, str]:
    """The phase of each member of a `gemm_rowreduce` region (anchor first, one reduction or row norm R):
      pre    full-width values not depending on R: computed in the GEMM epilogue
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


def _joins_rowreduce(n: Node, g: Graph, anchor: Node, roles: dict[str, str], has_r: bool) -> bool:
    """Can `n` join a `gemm_rowreduce` region whose members have `roles`?"""
    vals = n.value_args()
    if not vals or not all(v in roles for v in vals):
        return False
    n_cols = anchor.shape[-1]
    rows = _numel(anchor.shape) // n_cols if n_cols else 0
    reads = {roles[v] for v in vals}
    per_row = reads <= {"reduce", "row"}
    if n.op in REDUCE_OPS or n.op in ROW_NORM_OPS:
        return not has_r and reads == {"pre"} and _over_features(n, g, anchor)
    if per_row:  # per-row ops: read only per-row values, numbers and one-element parameters
        if _numel(n.shape) != rows:
            return False
        ok_arg = lambda a: isinstance(a, (str, Scalar)) or (isinstance(a, Param) and _numel(a.shape) == 1)
    else:
        if _squeezed(n.shape) != _squeezed(anchor.shape) or n.shape[-1] != n_cols:
            return False
        ok_arg = lambda a: _column_operand(a, n_cols, set(roles))
    if n.op in VIEW_OPS:
        return True
    return n.op in POINTWISE and len(n.args) == POINTWISE[n.op].arity and all(ok_arg(a) for a in n.args)


def _pool_fits(n: Node, g: Graph, anchor: Node, values: set[str]) -> bool:
    """A pool over the features of an (M, 1, N) view of the region, windows a power of two <= POOL_MAX."""
    x, k = n.args[0], n.args[1]
    if not isinstance(x, str) or x not in values or not isinstance(k, Scalar):
        return False
    k = int(k.value)
    rows, n_cols = anchor.shape
    return (g.shape_of(x) == (rows, 1, n_cols) and n.shape == (rows, 1, n_cols // k) and 0 < k <= POOL_MAX
            and k & (k - 1) == 0 and n_cols // k > 0)


def _joins_after_pool(n: Node, pooled: set[str], width: int, rows: int) -> bool:
    """Ops on the pooled values: views, and pointwise ops with numbers and one-element parameters."""
    vals = n.value_args()
    if not vals or not all(v in pooled for v in vals) or _squeezed(n.shape) != _squeezed((rows, width)):
        return False
    if n.op in VIEW_OPS:
        return True
    return n.op in POINTWISE and len(n.args) == POINTWISE[n.op].arity and all(
        isinstance(a, (str, Scalar)) or (isinstance(a, Param) and _numel(a.shape) == 1) for a in n.args)


def _grow(anchor: Node, g: Graph, taken: set[str]) -> tuple[str, list[Node]]:
    if anchor.op == "linear_rowsum":
        return _grow_gemv(anchor, g, taken)
    kind, members, values = "gemm_epilogue", [anchor], {anchor.name}
    pooled: set[str] = set()  # values after a pool, each (M, pool_width) up to size-1 dims
    pool_width = 0
    pool_rows: set[str] | None = None  # values after a reduction of the pooled features
    after_bn: set[str] | None = None  # values an op after BatchNorm may read
    for n in g.nodes[g.nodes.index(anchor) + 1:]:
        if n.name in taken:
            continue
        if kind == "gemm_epilogue" and len(anchor.shape) == 2 and (n.op in REDUCE_OPS or n.op in ROW_NORM_OPS) \
                and _joins_rowreduce(n, g, anchor, row_roles(members, g), False):
            kind = "gemm_rowreduce"
        if kind == "gemm_epilogue" and len(anchor.shape) == 2 and n.op in POOL_OPS and _pool_fits(n, g, anchor, values):
            kind, pool_width = "gemm_pool", n.shape[-1]
            members.append(n)
            pooled.add(n.name)
            continue
        if kind == "gemm_pool":
            rows = anchor.shape[0]
            if pool_rows is not None:  # after the reduction of the pooled row: per-row ops
                if _joins_after_pool(n, pool_rows, 1, rows):
                    members.append(n)
                    pool_rows.add(n.name)
            elif n.op in REDUCE_OPS and n.args[0] in pooled and _squeezed(g.shape_of(n.args[0])) == _squeezed(
                    (rows, pool_width)) and n.attrs.get("dim") in (-1, len(g.shape_of(n.args[0])) - 1):
                members.append(n)  # one reduction over the pooled features: per-tile partials, a finalize
                pool_rows = {n.name}
            elif _joins_after_pool(n, pooled, pool_width, anchor.shape[0]):
                members.append(n)
                pooled.add(n.name)
            continue
        if kind == "gemm_rowreduce":
            roles = row_roles(members, g)
            has_r = any(r == "reduce" for r in roles.values()) or any(m.op in ROW_NORM_OPS for m in members)
            if _joins_rowreduce(n, g, anchor, roles, has_r):
                members.append(n)
            continue
        readable = values if after_bn is None else after_bn
        new_kind = _joins(n, kind, anchor, readable)
        if new_kind is None:
            continue
        members.append(n)
        values.add(n.name)
        if n.op == "batch_norm":
            after_bn = {n.name}
        elif after_bn is not None:
            after_bn.add(n.name)
        kind = new_kind
    if kind not in ("gemm_rowreduce", "gemm_pool"):  # (M, N) tiles only: views to other shapes stay torch calls
        kept: set[str] = set()
        members = [m for m in members if (m is anchor or (m.shape == anchor.shape and all(
            a in kept for a in m.value_args()))) and not kept.add(m.name)]
    return kind, members


def _grow_gemv(anchor: Node, g: Graph, taken: set[str]) -> tuple[str, list[Node]]:
    """A GEMV region: the rowsum node and the per-row ops (and views) after it."""
    members = [anchor]
    values = {anchor.name}
    rows = _numel(anchor.shape)
    for n in g.nodes[g.nodes.index(anchor) + 1:]:
        if n.name in taken or not n.value_args() or not all(v in values for v in n.value_args()):
            continue
        if _numel(n.shape) != rows:
            continue
        ok = n.op in VIEW_OPS or (n.op in POINTWISE and len(n.args) == POINTWISE[n.op].arity and all(
            isinstance(a, (str, Scalar)) or (isinstance(a, Param) and _numel(a.shape) == 1) for a in n.args))
        if ok:
            members.append(n)
            values.add(n.name)
    return "gemv", members


def _outputs(members: list[Node], g: Graph) -> tuple[str, ...]:
    inside = {m.name for m in members}
    read_outside = {a for n in g.nodes if n.name not in inside for a in n.value_args()} | set(g.outputs)
    return tuple(m.name for m in members if m.name in read_outside)


def partition(g: Graph) -> list[Region]:
    """Regions in an order that runs correctly: a region sits at its anchor's place, and its members read
    only the anchor's input and each other, so nothing it needs is computed later."""
    taken: set[str] = set()
    regions: list[Region] = []
    for n in g.nodes:
        if n.name in taken:
            continue
        if is_gemm_anchor(n, g):
            kind, members = _grow(n, g, taken)
        else:
            kind, members = ("view" if n.op in NO_KERNEL_OPS else "torch"), [n]
        taken.update(m.name for m in members)
        # a region nothing reads still runs (a BatchNorm in it updates its statistics): it stores its last value
        regions.append(Region(kind, tuple(members), _outputs(members, g) or (members[-1].name,)))
    return regions
