"""Region kind `torch`: an op kfuse does not fuse stays the torch call the user wrote.

It is listed in the report's `unfused_ops`, and `--strict` turns it into an error.
"""

from __future__ import annotations

from kfuse.ir import Arg, Graph, Param, Scalar
from kfuse.ops import POINTWISE
from kfuse.partition import Region
from kfuse.regions.common import RegionCode


def _code_arg(a: Arg) -> str:
    if isinstance(a, (Param, Scalar)):
        return a.expr()
    return "None" if a is None else a


def generate(region: Region, g: Graph) -> RegionCode:
    (node,) = region.nodes
    code = node.fx_code
    if not code:  # a node made by a rewrite: spell it from the op table
        code = POINTWISE[node.op].torch_code(*[_code_arg(a) for a in node.args])
    note = "not fused" if region.kind == "torch" else "no kernel"  # "view": sizes, or a view of the same storage
    return RegionCode((), "", (f"{node.name} = {code}  # {note}: {node.origin}",))
