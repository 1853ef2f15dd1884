"""Region kind `gemm_epilogue`: one kernel, the GEMM tile and then a chain of pointwise ops on its fp32
accumulator while it is still in registers.

Anchors: nn.Linear / F.linear, `x @ W` (W a 2-d parameter or value; x 2-d or more), and batched products
(bmm, `x[..., M, K] @ w[..., K, N]` with the same leading dims). Ops after it join while every value they read is
the region's own, a number, or a per-column parameter. The other GEMM kinds take a walk of this kind over at the
first op it cannot take (a row reduction, a pool, a norm).

Bytes: x (M*K) and W (N*K) are read once per tile row/column (W tiles are shared through L2 by the
grouped tile order), the output M*N is written once per stored value; the pointwise chain is free next to
the 2*M*N*K flops. Without fusion each op would read and write M*N again.
Backward: dZ by one generated kernel (regions/pointwise_dz.py) when every op has a derivative row.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Param, Region
from kfuse.regions.common import (
    KernelArgs,
    RegionCode,
    batched_region_code,
    gemm_cost,
    gemm_region_code,
    linear_bias,
    pointwise_lines,
    store_lines,
)
from kfuse.regions.kind import EpilogueKind
from kfuse.regions.pointwise_dz import dz_kernel, pointwise_ok


def _shape(a: object, g: Graph) -> tuple[int, ...]:
    return a.shape if isinstance(a, Param) else g.shape_of(a) if isinstance(a, str) else ()


def is_gemm_anchor(n: Node, g: Graph) -> bool:
    """A product the GEMM tile runs: x W^T (+ b) with a 2-d W, x @ W, or a batched product."""
    if n.op == "linear":
        x, w = n.args[0], n.args[1]
        return isinstance(x, str) and len(_shape(w, g)) == 2 and all(n.shape) and (
            len(n.args) < 3 or n.args[2] is None or isinstance(n.args[2], Param))
    if n.op == "matmul":  # x @ W with W a 2-d parameter or value (a @ b of two inputs, a 3-d or 4-d tensor @ b)
        x, w = n.args
        if n.attrs.get("batched"):  # bmm, or x[..., M, K] @ w[..., K, N] with the same leading dims
            return isinstance(w, str) and g.shape_of(x)[:-2] == _shape(w, g)[:-2] and all(n.shape)
        return isinstance(x, str) and len(g.shape_of(x)) >= 2 and len(_shape(w, g)) == 2 and all(n.shape)
    return False


class GemmEpilogue(EpilogueKind):
    name = "gemm_epilogue"
    family = "gemm"
    upgradable = True

    def starts(self, n: Node, g: Graph) -> bool:
        return is_gemm_anchor(n, g)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        env: dict[str, str] = {}
        args = KernelArgs()
        body = linear_bias(region.anchor, env, args)
        body += pointwise_lines(list(region.nodes[1:]), env, args)
        body += store_lines(region, env)
        doc = "Fused: " + ", ".join(n.origin for n in region.nodes) + "."
        if region.anchor.attrs.get("batched"):
            return batched_region_code(region, stem, args, body, doc, cost=gemm_cost(region, g))
        return gemm_region_code(region, stem, args, body, doc, cost=gemm_cost(region, g))

    def dz_plan(self, region: Region, stem: str) -> tuple[str, list[str], list[str], tuple[str, ...]] | None:
        """Every op after the GEMM pointwise with a derivative row: one generated dZ kernel."""
        n_cols = region.anchor.shape[-1]
        if not all(pointwise_ok(n, n_cols) for n in region.nodes[1:]):
            return None
        return (*dz_kernel(region, stem), ())


KIND = GemmEpilogue()
