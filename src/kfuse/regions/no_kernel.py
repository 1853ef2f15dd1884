"""Region kind `no_kernel`: a node that launches nothing, kept as the torch call the user wrote.

A host value (a tensor's sizes, arithmetic on them: capture's `shape` op) or a view sharing a tensor's storage (a
transpose: capture's `alias` op, which a GEMM reads through strides). Not listed in `unfused_ops`: there is no
kernel to fuse.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Region
from kfuse.regions.common import RegionCode
from kfuse.regions.kind import RegionKind
from kfuse.regions.torch_call import call_line

NO_KERNEL_OPS = ("shape", "alias")


class NoKernel(RegionKind):
    name = "no_kernel"
    fused = False

    def starts(self, n: Node, g: Graph) -> bool:
        return n.op in NO_KERNEL_OPS

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return RegionCode((), "", (call_line(region.anchor, "no kernel"),))


KIND = NoKernel()
