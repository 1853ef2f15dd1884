"""Region kind `torch`: an op kfuse does not fuse stays the torch call the user wrote.

It is listed in the report's `unfused_ops`, and `--strict` turns it into an error. It takes any node, so it comes
last in the registry.
"""

from __future__ import annotations

from kfuse.ir import Arg, Graph, Node, Param, Region, Scalar
from kfuse.ops import POINTWISE
from kfuse.regions.common import RegionCode
from kfuse.regions.kind import RegionKind


def _code_arg(a: Arg) -> str:
    if isinstance(a, (Param, Scalar)):
        return a.expr()
    return "None" if a is None else a


def call_line(node: Node, note: str) -> str:
    """The forward line running `node` as written (a node a rewrite made: spelled from the op table)."""
    code = node.fx_code or POINTWISE[node.op].torch_code(*[_code_arg(a) for a in node.args])
    return f"{node.name} = {code}  # {note}: {node.origin}"


class TorchCall(RegionKind):
    name = "torch"
    fused = False
    unfused_op = True

    def starts(self, n: Node, g: Graph) -> bool:
        return True

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return RegionCode((), "", (call_line(region.anchor, "not fused"),))


KIND = TorchCall()
