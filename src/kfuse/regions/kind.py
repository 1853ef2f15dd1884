"""What a region kind is: one object that admits nodes into a region and generates the region's code.

Partition (kfuse/partition.py) walks the graph with the kinds of the registry (kfuse/regions/__init__.py, in
admission order) and knows none of them by name:
  starts(n, g)      the first kind whose `starts` takes node n anchors a region there (the last kind takes any);
  joins(walk, n)    each later node the region's current kind admits joins it;
  enters(walk, n)   where the current kind is `upgradable` (the plain GEMM epilogue) and refuses n, the first kind
                    that `enters` at n takes the walk over: the region becomes that kind from then on;
  finish(walk)      the members the region keeps (a kind may drop members it cannot store).
Codegen then asks the region's kind for its code (`generate`), its fused backward (`dz_plan`) and the exact
rewrites it applies when ModelNew runs (`call_time_rewrites`). Each kind lives in one file under regions/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kfuse.ir import Graph, Node, Param, Region, Scalar
from kfuse.ops import POINTWISE, VIEW_OPS

if TYPE_CHECKING:
    from kfuse.regions.common import RegionCode

GROUP_MAX = 128  # widest group (channels) fused into one column tile: on an H100 no 256-wide tile config of
# the fp16x3p GroupNorm kernel compiled (kfuse autotune: "no config ran", problem 27, 1024x8192x8192), so wider
# groups take the two-phase kind


@dataclass
class Walk:
    """A region being grown from its anchor: members so far, anchor first, in graph order."""

    anchor: Node
    g: Graph
    members: list[Node]

    @property
    def values(self) -> set[str]:
        return {m.name for m in self.members}

    @property
    def tile_2d(self) -> bool:
        """Is the anchor's output one (M, N) tile grid (the kinds with row or group statistics need it)?"""
        return len(self.anchor.shape) == 2


class RegionKind:
    """A region kind. Subclasses set `name` and override what they do; the defaults admit nothing."""

    name: ClassVar[str] = ""
    fused: ClassVar[bool] = True  # False: no kernel of kfuse's (a torch call as written, or no kernel at all)
    unfused_op: ClassVar[bool] = False  # its op is a torch call kfuse could not fuse (the report's unfused_ops)
    upgradable: ClassVar[bool] = False  # can another kind take a walk of this kind over (`enters`)?
    kernel_modules: ClassVar[tuple[str, ...]] = ()  # fixed kernels the generated code calls: kfuse/kernels/<m>.py
    family: ClassVar[str] = ""  # what its regions are anchored on: "gemm" or "conv" ("" for the kinds of no kernel)
    at_ops: ClassVar[tuple[str, ...]] = ()  # the ops at which it starts a region or takes a walk over (what makes
    # a region this kind rather than its anchor's plain epilogue): how another backend finds it (kfuse/cuda)

    def starts(self, n: Node, g: Graph) -> bool:
        return False

    def joins(self, walk: Walk, n: Node) -> bool:
        return False

    def enters(self, walk: Walk, n: Node) -> bool:
        return False

    def finish(self, walk: Walk) -> list[Node]:
        return walk.members

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        """Kernels, launcher and forward lines; every name it defines starts with `stem` (unique in the file)."""
        raise NotImplementedError(self.name)

    def dz_plan(self, region: Region, stem: str) -> tuple[str, list[str], list[str], tuple[str, ...]] | None:
        """The generated epilogue-backward kernel (source, parameter expressions, scalar expressions, extra
        `epilogue_dz` arguments), or None: the ops after the GEMM are differentiated in torch."""
        return None

    def call_time_rewrites(self, region: Region) -> list[str]:
        return []


def numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def column_operand(a: Any, n_cols: int, values: set[str]) -> bool:
    """Can a fused pointwise op read this operand? Region values, numbers, per-column or 1-element params."""
    if isinstance(a, str):
        return a in values
    if isinstance(a, Scalar):
        return True
    if isinstance(a, Param):
        return (len(a.shape) >= 1 and a.shape[-1] == n_cols and all(d == 1 for d in a.shape[:-1])) or all(
            d == 1 for d in a.shape)
    return False


def per_row_operand(a: Any) -> bool:
    """Operands of ops on per-row values: values, numbers and one-element parameters."""
    return isinstance(a, (str, Scalar)) or (isinstance(a, Param) and numel(a.shape) == 1)


def pointwise_with(n: Node, ok: Any) -> bool:
    """A pointwise op of the table, at its arity, whose every operand passes `ok`."""
    return n.op in POINTWISE and len(n.args) == POINTWISE[n.op].arity and all(ok(a) for a in n.args)


def tile_joins(walk: Walk, n: Node, readable: set[str]) -> bool:
    """Ops on the GEMM's (M, N) tile that read only `readable` region values: size-1 views and pointwise ops
    with numbers and per-column parameters."""
    anchor = walk.anchor
    if n.op in VIEW_OPS:  # size-1 dims added or removed: the same values (kept only if a reduction follows)
        return n.args[0] in readable and squeezed(n.shape) == squeezed(anchor.shape)
    if n.shape != anchor.shape or not n.value_args():
        return False
    return pointwise_with(n, lambda a: column_operand(a, anchor.shape[-1], readable))


def same_tile(walk: Walk, outside: Any = None) -> list[Node]:
    """The members stored as (M, N) tiles: views to other shapes (kept only for a reduction) stay torch calls.
    `outside(value)`: values from outside the region a member may read too (the plain convolution kind's
    outside_value)."""
    kept: set[str] = set()
    anchor = walk.anchor
    return [m for m in walk.members if (m is anchor or (m.shape == anchor.shape and all(
        a in kept or (outside is not None and outside(a)) for a in m.value_args()))) and not kept.add(m.name)]


def norm_of_tile(walk: Walk, n: Node, op: str) -> bool:
    """Node n is the walk's first norm `op` over its 2-d GEMM output."""
    return (n.op == op and walk.tile_2d and n.shape == walk.anchor.shape and bool(n.args)
            and n.args[0] in walk.values)


def group_size(n: Node, n_cols: int) -> int | None:
    """Channels per group of GroupNorm node n over `n_cols` channels, or None when it cannot be fused (group
    count not a number dividing the channels, affine parameters not per channel)."""
    groups = n.args[1]
    if not isinstance(groups, Scalar) or groups.value <= 0 or n_cols % int(groups.value):
        return None
    if not all(a is None or (isinstance(a, Param) and a.shape == (n_cols,)) for a in n.args[2:4]):
        return None
    return n_cols // int(groups.value)


def whole_groups_in_tile(size: int) -> bool:
    """Does a column tile hold whole groups of `size` channels (a power of two <= GROUP_MAX)?"""
    return size <= GROUP_MAX and size & (size - 1) == 0


class EpilogueKind(RegionKind):
    """Kinds whose ops run on the GEMM's (M, N) tile: pointwise ops read region values, numbers and per-column
    parameters; only (M, N) values are kept."""

    def readable(self, walk: Walk) -> set[str]:
        return walk.values

    def joins(self, walk: Walk, n: Node) -> bool:
        return tile_joins(walk, n, self.readable(walk))

    def finish(self, walk: Walk) -> list[Node]:
        return same_tile(walk)
