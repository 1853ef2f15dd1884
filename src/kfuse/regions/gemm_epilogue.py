"""Region kind `gemm_epilogue`: one kernel, the GEMM tile and then a chain of pointwise ops on its fp32
accumulator while it is still in registers.

Bytes: x (M*K) and W (N*K) are read once per tile row/column (W tiles are shared through L2 by the
grouped tile order), the output M*N is written once per stored value; the pointwise chain is free next to
the 2*M*N*K flops. Without fusion each op would read and write M*N again.
"""

from __future__ import annotations

from kfuse.ir import Graph
from kfuse.partition import Region
from kfuse.regions.common import (KernelArgs, RegionCode, batched_region_code, gemm_region_code, kernel_name, linear_bias,
                                  pointwise_lines, store_lines)


def generate(region: Region, g: Graph) -> RegionCode:
    env: dict[str, str] = {}
    args = KernelArgs()
    body = linear_bias(region.anchor, env, args)
    body += pointwise_lines(list(region.nodes[1:]), env, args)
    body += store_lines(region, env)
    doc = "Fused: " + ", ".join(n.origin for n in region.nodes) + "."
    if region.anchor.attrs.get("batched"):
        return batched_region_code(region, kernel_name(region), args, body, doc)
    return gemm_region_code(region, kernel_name(region), args, body, doc)
