"""Stage 4, partition: group the graph's nodes into regions, each of which becomes one launcher.

A region starts at a node the first kind of the registry (kfuse/regions/__init__.py, in admission order) takes,
and grows over the later nodes its kind admits; a plain GEMM epilogue is taken over by a kind that admits what
it cannot (a row reduction, a pool, a norm). The kinds say what they admit (kfuse/regions/kind.py); this module
only walks. A GEMM (nn.Linear, F.linear, `@`, matmul, bmm, einsum products) anchors a fused region; every other
node is a region of its own that stays a torch call (listed in the report's `unfused_ops`) or, for a host value
or a view sharing storage, launches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from kfuse.ir import Graph, Node, Region
from kfuse.regions import KINDS
from kfuse.regions.kind import RegionKind, Walk


def grow(kind: RegionKind, anchor: Node, g: Graph, taken: set[str],
         kinds: Sequence[RegionKind] = KINDS) -> tuple[RegionKind, list[Node]]:
    """The region anchored at `anchor`: its final kind and members (nodes in `taken` belong to earlier regions)."""
    walk = Walk(anchor, g, [anchor])
    for n in g.nodes[g.nodes.index(anchor) + 1:]:
        if n.name in taken:
            continue
        if kind.joins(walk, n):
            walk.members.append(n)
        elif kind.upgradable and (upgrade := next((k for k in kinds if k.enters(walk, n)), None)) is not None:
            kind = upgrade
            walk.members.append(n)
    return kind, kind.finish(walk)


def _outputs(members: list[Node], g: Graph) -> tuple[str, ...]:
    inside = {m.name for m in members}
    read_outside = {a for n in g.nodes if n.name not in inside for a in n.value_args()} | set(g.outputs)
    return tuple(m.name for m in members if m.name in read_outside)


def partition(g: Graph, kinds: Sequence[RegionKind] = KINDS) -> list[Region]:
    """Regions in an order that runs correctly: a region sits at its anchor's place, and its members read
    only the anchor's input and each other, so nothing it needs is computed later. `kinds`: the registry to walk
    with (a backend with fewer kinds passes its own: kfuse/cuda/regions.py)."""
    taken: set[str] = set()
    regions: list[Region] = []
    for n in g.nodes:
        if n.name in taken:
            continue
        kind, members = grow(next(k for k in kinds if k.starts(n, g)), n, g, taken, kinds)
        taken.update(m.name for m in members)
        # a region nothing reads still runs (a BatchNorm in it updates its statistics): it stores its last value
        regions.append(Region(kind.name, tuple(members), _outputs(members, g) or (members[-1].name,)))
    return regions
