"""Stage 4, partition: group the graph's nodes into regions, each of which becomes one launcher.

A GEMM (nn.Linear, F.linear, or `x @ W` against a 2-d parameter) anchors a region; the ops after it join
while every value they read is the region's own, a scalar, or a per-column parameter:
  - pointwise ops (the table in ops.py)                        -> kind `gemm_epilogue`
  - GroupNorm over the GEMM's columns, groups a power of two
    no wider than GROUP_MAX (a column tile holds whole groups)  -> kind `gemm_groupnorm`
  - BatchNorm1d over the GEMM's output                         -> kind `gemm_batchnorm`
    (ops after it must read only values after it: they run in the apply pass)
Every other node is a region of kind `torch` on its own: it stays a torch call in ModelNew and is listed
in the report's `unfused_ops`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfuse.ir import Graph, Node, Param, Scalar
from kfuse.ops import POINTWISE

GROUP_MAX = 256  # widest group (channels) fused into one column tile


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


def is_gemm_anchor(n: Node, g: Graph) -> bool:
    if n.op == "linear":
        x, w = n.args[0], n.args[1]
        return isinstance(x, str) and isinstance(w, Param) and len(w.shape) == 2 and (
            len(n.args) < 3 or n.args[2] is None or isinstance(n.args[2], Param))
    if n.op == "matmul":
        x, w = n.args
        return isinstance(x, str) and len(g.shape_of(x)) >= 2 and isinstance(w, Param) and len(w.shape) == 2
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


def _group_fits(n: Node, n_cols: int) -> bool:
    groups = n.args[1]
    if not isinstance(groups, Scalar) or groups.value <= 0 or n_cols % int(groups.value):
        return False
    size = n_cols // int(groups.value)
    return size <= GROUP_MAX and size & (size - 1) == 0


def _joins(n: Node, kind: str, anchor: Node, values: set[str]) -> str | None:
    """The region kind after `n` joins, or None if it cannot."""
    if n.shape != anchor.shape or not n.value_args():
        return None
    n_cols = anchor.shape[-1]
    if n.op in POINTWISE:
        ok = len(n.args) == POINTWISE[n.op].arity and all(_column_operand(a, n_cols, values) for a in n.args)
        return kind if ok else None
    if kind != "gemm_epilogue" or len(anchor.shape) != 2 or n.args[0] not in values:
        return None  # one norm per region, over a 2-d GEMM output
    if n.op == "group_norm" and _group_fits(n, n_cols) and all(
            a is None or (isinstance(a, Param) and a.shape == (n_cols,)) for a in n.args[2:4]):
        return "gemm_groupnorm"
    if n.op == "batch_norm":
        return "gemm_batchnorm"
    return None


def _grow(anchor: Node, g: Graph, taken: set[str]) -> tuple[str, list[Node]]:
    kind, members, values = "gemm_epilogue", [anchor], {anchor.name}
    after_bn: set[str] | None = None  # values an op after BatchNorm may read
    for n in g.nodes[g.nodes.index(anchor) + 1:]:
        if n.name in taken:
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
    return kind, members


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
            kind, members = "torch", [n]
        taken.update(m.name for m in members)
        regions.append(Region(kind, tuple(members), _outputs(members, g)))
    return regions
