"""The region kinds of the CUDA backend, and why each op it leaves unfused stays a torch call.

The backend fuses one kind so far: the plain GEMM epilogue kind of the registry (the one kind that is `upgradable`),
as it anchors on nn.Linear / F.linear / `x @ W` with W a 2-d parameter (not batched products, not products of two
values: their operands are not cached weights), and the pointwise chain after it. It never hands a walk over to the
norm, reduction or pool kinds (no CUDA versions yet): a GroupNorm after the GEMM ends the region, and stays a torch
call with the ops after it. The kinds that launch nothing of kfuse's (host values and views, torch calls) are the
registry's own. Kinds are found in the registry by what they are, never by name (tests/unit/test_region_kinds.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from kfuse.ir import Graph, Node, Param
from kfuse.modes import Variant
from kfuse.partition import partition
from kfuse.regions import KINDS as REGISTRY
from kfuse.regions.kind import RegionKind

BACKEND = "cuda"


EPILOGUE = next(k for k in REGISTRY if k.upgradable)  # the GEMM + pointwise epilogue kind, where GEMM regions start


def weight_gemm(n: Node, g: Graph) -> bool:
    """nn.Linear / F.linear, or x @ W, with W a 2-d parameter (its split is cached) and no batch of products."""
    return (EPILOGUE.starts(n, g) and n.op in ("linear", "matmul") and not n.attrs.get("batched")
            and isinstance(n.args[1], Param) and len(n.args[1].shape) == 2)


class CudaGemmEpilogue(type(EPILOGUE)):
    """The GEMM epilogue kind as the CUDA backend runs it (same name: the report and the registry's flags are the
    Triton kind's): weight GEMMs only, never taken over by another kind."""

    upgradable = False

    def starts(self, n: Node, g: Graph) -> bool:
        return weight_gemm(n, g)


# the epilogue kind, then the registry's kinds that launch no kernel of kfuse's, in its order (torch calls last)
KINDS: tuple[RegionKind, ...] = (CudaGemmEpilogue(), *[k for k in REGISTRY if not k.fused])
FUSED_KINDS = (EPILOGUE.name,)


def unfused_reasons(v: Variant) -> dict[str, str]:
    """Each op the CUDA partition leaves a torch call -> why, found by partitioning the same graph with the
    Triton backend's registry: a kind with no CUDA version yet, a GEMM the CUDA kind does not take, or no kind."""
    triton_kind = {n.name: r.kind for r in partition(v.graph) if r.fused for n in r.nodes}
    reasons = {}
    for r in v.regions:
        if not r.unfused:
            continue
        for n in r.nodes:
            kind = triton_kind.get(n.name)
            if kind is None:
                why = "no region kind fuses it (a torch call with --backend triton too)"
            elif n.op in ("linear", "matmul"):
                why = (f"--backend cuda fuses only a Linear or x @ W with a 2-d weight parameter (--backend triton: "
                       f"{kind})")
            else:
                why = f"--backend triton fuses it in a {kind} region, which has no CUDA version yet"
            reasons[n.origin] = why
    return reasons


def fused_ok(variants: Sequence[Variant]) -> bool:
    """Every fused region of every forward is of a kind this backend generates."""
    return all(r.kind in FUSED_KINDS for v in variants for r in v.regions if r.fused)
