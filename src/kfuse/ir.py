"""The graph kfuse works on: a flat, topologically ordered list of canonical ops over named values.

Capture turns torch.fx's graph into this; rewrite, partition and codegen read and transform it; partition groups
its nodes into `Region`s, one launcher each. Nothing here refers to fx, so the later stages are plain data
transformations.
"""

from __future__ import annotations

import keyword
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Union


def attr_expr(path: str, root: str = "self") -> str:
    """Python source reaching the submodule, parameter or attribute at dotted `path` from `root`.

    Containers name their children by position ("network.0.weight" in an nn.Sequential or nn.ModuleList), which
    is no attribute name: those parts are indexed (`self.network[0].weight`); a part that is neither an
    identifier nor an index (a ModuleDict key such as "conv-1") is read with getattr, which every Module has."""
    expr = root
    for part in path.split(".") if path else []:
        if part.isidentifier() and not keyword.iskeyword(part):
            expr += f".{part}"
        elif part.isdigit():
            expr += f"[{int(part)}]"
        else:
            expr = f"getattr({expr}, {part!r})"
    return expr


@dataclass(frozen=True)
class Param:
    """A parameter or buffer of the model, by its dotted path ("gemm.weight"); read at run time."""

    path: str
    shape: tuple[int, ...]

    def expr(self) -> str:
        return attr_expr(self.path)


@dataclass(frozen=True)
class Scalar:
    """A number. `attr` is the model attribute it comes from ("leaky_relu.negative_slope"), read at run
    time so a ModelNew built with other constructor arguments stays right; None for true literals."""

    value: float
    attr: str | None = None

    def expr(self) -> str:
        if self.attr is not None:
            return attr_expr(self.attr)
        if self.value != self.value or self.value in (float("inf"), float("-inf")):
            return f"float({str(self.value)!r})"
        return repr(self.value)


Arg = Union[str, Param, Scalar, None]  # str: the name of another value in the graph


@dataclass(frozen=True)
class Node:
    name: str
    op: str  # canonical op name, see ops.py
    args: tuple[Arg, ...]
    shape: tuple[int, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)  # static attributes (dim, keepdim, approximate)
    module: str | None = None  # the submodule it came from, if any ("bn"); codegen reads its state
    origin: str = ""  # what the user wrote, for reports: "nn.Linear gemm", "operator.mul"
    fx_code: str = ""  # a Python expression reproducing the original call, for the torch fallback

    def value_args(self) -> list[str]:
        return [a for a in self.args if isinstance(a, str)]

    def with_(self, **changes: Any) -> "Node":
        return replace(self, **changes)


@dataclass(frozen=True)
class Graph:
    inputs: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    output_structure: str = "single"  # "single" | "tuple" | "list" | the return expression over value names

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def users(self, name: str) -> list[Node]:
        return [n for n in self.nodes if name in n.value_args()]

    def use_count(self, name: str) -> int:
        return sum(n.value_args().count(name) for n in self.nodes) + self.outputs.count(name)

    def shape_of(self, name: str) -> tuple[int, ...]:
        if name in self.inputs:
            return self.input_shapes[self.inputs.index(name)]
        return self.node(name).shape

    def with_nodes(self, nodes: tuple[Node, ...] | list[Node], outputs: tuple[str, ...] | None = None) -> "Graph":
        return replace(self, nodes=tuple(nodes), outputs=self.outputs if outputs is None else tuple(outputs))


@dataclass(frozen=True)
class Region:
    """Nodes that run as one unit: a fused launcher, or one torch call. `kind` names a RegionKind of the registry
    (kfuse.regions.KINDS), which admitted the nodes and generates their code."""

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
        """Does the region launch kfuse's own kernels (False: a torch call as written, or no kernel at all)?"""
        from kfuse.regions import kind_of  # the registry imports this module

        return kind_of(self.kind).fused

    @property
    def unfused(self) -> bool:
        """Is it a torch call kfuse could not fuse (listed in the report's `unfused_ops`)?"""
        from kfuse.regions import kind_of

        return kind_of(self.kind).unfused_op
