"""The region kinds of the CUDA backend, and why each op it leaves unfused stays a torch call.

The backend's kinds are the registry's GEMM kinds (`family == "gemm"`), each made a CUDA twin by a mixin found by
the ops it takes a region over at (`at_ops`): the twin admits what the registry's kind admits where the CUDA code
can run it, and its `cuda_code` writes the region's code:
  the plain epilogue   nn.Linear / F.linear / `x @ W` with W a 2-d parameter and the pointwise chain after it
                       (kfuse/cuda/epilogue.py), and `x @ y` of two values, y 2-d or a batch of products (bmm,
                       x[..., M, K] @ y[..., K, N] with the same leading dims: one launch), split on every call
                       (nothing to cache; KFUSE_CUDA_PRODUCTS=0 leaves them to torch) unless K >= LONG_K (no split-K
                       in CUDA: long_k).
                       (the other kinds take over only a weight GEMM's walk: their CUDA code reads W)
  the row sum          the sum or mean over a GEMM's features rewritten to a GEMV (rewrite.py), W a 2-d parameter,
                       and the per-row ops after it (kfuse/cuda/rowsum.py)
  GroupNorm            over the GEMM's columns, any group size: one CUDA pass serves both registry kinds, which
                       differ in how a Triton column tile holds the groups (kfuse/cuda/norms.py)
  BatchNorm1d          modules over the GEMM's rows (kfuse/cuda/norms.py)
  a row reduction      or row norm over the GEMM's features (kfuse/cuda/rowreduce.py)
  a pool               over the GEMM's features, its ops and a reduction of the pooled row (kfuse/cuda/pool.py)
  the plain conv        nn.Conv1d/2d/3d, nn.ConvTranspose1d/2d/3d and their functional forms (any groups, depthwise
  epilogue              ones too, a depthwise transposed one as well, which the registry's kind leaves to torch) and
                        the pointwise chain after it (the registry's upgradable conv kind; kfuse/cuda/conv.py): an
                        implicit-GEMM tile on x's packed records, or the direct tile where a group has few channels; a
                        transposed convolution one launch of it per stride phase
  a norm after a conv   GroupNorm or InstanceNorm (kfuse/cuda/conv_norms.py), unless KFUSE_CUDA_CONV_NORMS=0, or a
                        BatchNorm module (training or eval; conv_norms.py too); a pool or mean after the norm, which
                        the registry's kinds take, stays a torch call after the region
  over the channels     a reduction or softmax over a convolution's channels, its ops before and after
                        (kfuse/cuda/conv_channels.py)
  a pool after a conv   a windowed pool or global mean after a convolution, its ops and a mean of the pooled
                        values (kfuse/cuda/conv_pools.py), when KFUSE_CUDA_CONV_POOLS=1
The kinds that launch nothing of kfuse's (host values and views, torch calls) are the registry's own. Kinds are
found in the registry by what they are, never by name (tests/unit/test_region_kinds.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from kfuse.cuda import conv, conv_channels, conv_norms, conv_pools, epilogue, norms, pool, rowreduce, rowsum
from kfuse.ir import Graph, Node, Param
from kfuse.kernels.gemm_core import LONG_K
from kfuse.modes import Variant
from kfuse.ops import CONV_OPS, POOL_OPS, REDUCE_OPS, ROW_NORM_OPS, VIEW_OPS
from kfuse.partition import partition
from kfuse.regions import KINDS as REGISTRY
from kfuse.regions.conv_common import MEANS, TRANSPOSED, WINDOWED, has_tile_operands, outside_value
from kfuse.regions.kind import RegionKind, Walk

BACKEND = "cuda"


EPILOGUE = next(k for k in REGISTRY if k.upgradable and k.family == "gemm")  # where GEMM regions start
CONV_EPILOGUE = next(k for k in REGISTRY if k.upgradable and k.family == "conv")  # where conv regions start
CONV_NORM = next(k for k in REGISTRY if k.family == "conv" and "instance_norm" in k.at_ops)  # a norm after a conv
CONV_BN = next(k for k in REGISTRY if k.family == "conv" and k.at_ops == ("batch_norm",))  # a BatchNorm after a conv
CONV_POOL = next(k for k in REGISTRY if k.family == "conv" and "mean_dims" in k.at_ops)  # a pool after a conv
CONV_CHANNELS = next(k for k in REGISTRY if k.family == "conv" and "logsumexp" in k.at_ops)  # over a conv's channels
PRODUCTS_SWITCH = "KFUSE_CUDA_PRODUCTS"  # "0": leave products of two values to torch (the A/B against them)


def long_k(n: Node, g: Graph) -> bool:
    """A product over K >= LONG_K: the CUDA tiles sum all of K in one fp32 chain (no split-K), whose truncation bias
    adds up over positive operands: KernelBench level-1 6 (two torch.rand values, K = 524288) missed rule 3 by 4.9x
    eager's error on an H200. Weight GEMMs keep their tile (problems/gemm 02, 15 and 42, K = 32768, met the contract
    on an H100: a layer's weights have both signs)."""
    return isinstance(n.args[0], str) and g.shape_of(n.args[0])[-1] >= LONG_K


def weight_gemm(n: Node, g: Graph) -> bool:
    """nn.Linear / F.linear, or x @ W, with W a 2-d parameter (its split is cached) and no batch of products."""
    return (EPILOGUE.starts(n, g) and n.op in ("linear", "matmul") and not n.attrs.get("batched")
            and isinstance(n.args[1], Param) and len(n.args[1].shape) == 2)


def value_product(n: Node, g: Graph) -> bool:
    """`x @ y` of two values, y 2-d or a batch of products (EPILOGUE.starts checks the shapes: x may have leading
    dimensions, a batch's are the same on both sides), K short of LONG_K."""
    return EPILOGUE.starts(n, g) and n.op == "matmul" and isinstance(n.args[1], str) and not long_k(n, g)


def products_on() -> bool:
    return os.environ.get(PRODUCTS_SWITCH, "1") != "0"


class Epilogue:
    """The plain GEMM epilogue: weight GEMMs and products of two values (unless KFUSE_CUDA_PRODUCTS=0)."""

    cuda_code = staticmethod(epilogue.region_code)

    def starts(self, n: Node, g: Graph) -> bool:
        return weight_gemm(n, g) or (products_on() and value_product(n, g))


class OnWeightGemm:
    """A kind that takes an epilogue walk over only where its GEMM is a weight GEMM (its CUDA code reads W)."""

    def enters(self, walk: Walk, n: Node) -> bool:
        return weight_gemm(walk.anchor, walk.g) and super().enters(walk, n)


class RowSum:
    """The row sum of a GEMM with a 2-d weight parameter (its float64 row sums are cached on it)."""

    cuda_code = staticmethod(rowsum.region_code)

    def starts(self, n: Node, g: Graph) -> bool:
        w = n.args[1] if n.op == "linear_rowsum" else None
        return isinstance(w, Param) and len(w.shape) == 2 and super().starts(n, g)


class GroupNorm(OnWeightGemm):
    cuda_code = staticmethod(norms.region_code)


class BatchNorm(OnWeightGemm):
    """BatchNorm1d modules only (the launcher reads the module's mode and running statistics); no eval-mode fold
    (the CUDA pass applies the running statistics per column instead)."""

    cuda_code = staticmethod(norms.region_code)

    def enters(self, walk: Walk, n: Node) -> bool:
        return bool(n.module) and super().enters(walk, n)

    def call_time_rewrites(self, region) -> list[str]:
        return []


class RowReduce(OnWeightGemm):
    """A reduction or row norm over the GEMM's features (kfuse/cuda/rowreduce.py)."""

    cuda_code = staticmethod(rowreduce.region_code)


class Pool(OnWeightGemm):
    """A pool over the GEMM's features, its ops and a reduction of the pooled row (kfuse/cuda/pool.py)."""

    cuda_code = staticmethod(pool.region_code)


class Conv:
    """The plain epilogue after a convolution or a transposed one, depthwise ones too (kfuse/cuda/conv.py)."""

    cuda_code = staticmethod(conv.region_code)

    def starts(self, n: Node, g: Graph) -> bool:
        """Any convolution with a parameter weight (a parameter bias or none): the registry's kind also leaves a
        depthwise transposed one to torch."""
        return has_tile_operands(n)

    def joins(self, walk: Walk, n: Node) -> bool:
        """The registry kind's ops, except one reading a value computed outside the region (its CUDA code loads
        region values, numbers and per-channel operands only) and views (not run by its code yet)."""
        return (n.op not in VIEW_OPS and not any(outside_value(a, walk) for a in n.args)
                and super().joins(walk, n))


POOLING = (*WINDOWED, *MEANS)  # what the registry's norm kinds take after the norm and conv_norms.py does not run


class NormNoPool:
    """A norm kind's twin stops before a pool or mean after the norm: conv_norms.py's pass stores every value at the
    convolution's shape (the registry's kind runs its apply pass in the pool's rows instead)."""

    def joins(self, walk: Walk, n: Node) -> bool:
        return n.op not in POOLING and super().joins(walk, n)


class ConvNorm(NormNoPool):
    """A GroupNorm or InstanceNorm after a convolution (kfuse/cuda/conv_norms.py), unless KFUSE_CUDA_CONV_NORMS=0."""

    cuda_code = staticmethod(conv_norms.region_code)

    def enters(self, walk: Walk, n: Node) -> bool:
        return conv_norms.switched_on() and super().enters(walk, n)


class ConvBatchNorm(NormNoPool):
    """A BatchNorm module after a convolution (kfuse/cuda/conv_norms.py); no eval-mode fold into the convolution's
    weight (the pass applies the running statistics per channel instead)."""

    cuda_code = staticmethod(conv_norms.region_code)

    def call_time_rewrites(self, region) -> list[str]:
        return []


class ConvPool:
    """A pool after a convolution (kfuse/cuda/conv_pools.py), when KFUSE_CUDA_CONV_POOLS=1."""

    cuda_code = staticmethod(conv_pools.region_code)

    def enters(self, walk: Walk, n: Node) -> bool:
        return conv_pools.switched_on() and super().enters(walk, n)


class ConvChannels:
    """A reduction or softmax over a convolution's channels (kfuse/cuda/conv_channels.py)."""

    cuda_code = staticmethod(conv_channels.region_code)


# the conv kinds' twins, by kind (the ops they take a region over at are the GEMM twins' keys too)
CONV_TWINS = {CONV_EPILOGUE: Conv, CONV_NORM: ConvNorm, CONV_BN: ConvBatchNorm, CONV_CHANNELS: ConvChannels,
              CONV_POOL: ConvPool}
# a GEMM kind's twin, by the op it takes a region over at (the plain epilogue: by none)
TWINS = {"linear_rowsum": RowSum, "group_norm": GroupNorm, "batch_norm": BatchNorm,
         **{op: RowReduce for op in REDUCE_OPS + ROW_NORM_OPS}, **{op: Pool for op in POOL_OPS}}


def twin(kind: RegionKind) -> RegionKind:
    """The registry's GEMM kind with its CUDA mixin in front (same name: the report and the flags are the registry
    kind's)."""
    mixin = CONV_TWINS.get(kind) or (TWINS[kind.at_ops[0]] if kind.at_ops else Epilogue)
    return type(f"Cuda{type(kind).__name__}", (mixin, type(kind)), {"__doc__": mixin.__doc__})()


# the twins in the registry's order, then the registry's kinds that launch no kernel of kfuse's (torch calls last)
FUSED: tuple[RegionKind, ...] = tuple(twin(k) for k in REGISTRY if k.family == "gemm" or k in CONV_TWINS)
KINDS: tuple[RegionKind, ...] = (*FUSED, *[k for k in REGISTRY if not k.fused])
FUSED_KINDS = tuple(k.name for k in FUSED)


PRODUCTS_NOTE = f" (or x @ y of two values, batched too: not with {PRODUCTS_SWITCH}=0)"


def after_pooling(n: Node, unfused: dict[str, Node]) -> bool:
    """Does n read, directly or through other nodes left unfused, a pool or mean's value?"""
    seen: set[str] = set()
    todo = [a for a in n.args if isinstance(a, str)]
    while todo:
        a = todo.pop()
        if a in seen or a not in unfused:
            continue
        seen.add(a)
        if unfused[a].op in POOLING:
            return True
        todo += [b for b in unfused[a].args if isinstance(b, str)]
    return False


def unfused_reasons(v: Variant) -> dict[str, str]:
    """Each op the CUDA partition leaves a torch call -> why, found by partitioning the same graph with the
    Triton backend's registry: a kind with no CUDA version yet, a GEMM the CUDA kind does not take, or no kind."""
    triton_kind = {n.name: r.kind for r in partition(v.graph) if r.fused for n in r.nodes}
    reasons = {}
    unfused = {n.name: n for r in v.regions if r.unfused for n in r.nodes}
    for r in v.regions:
        if not r.unfused:
            continue
        for n in r.nodes:
            kind = triton_kind.get(n.name)
            if kind is None:
                why = "no region kind fuses it (a torch call with --backend triton too)"
            elif n.op == "matmul" and isinstance(n.args[1], str) and long_k(n, v.graph):
                why = (f"a product of two values over K >= {LONG_K}: --backend cuda has no split-K, and one fp32 "
                       f"chain over K misses rule 3 (--backend triton: {kind})")
            elif n.op in (*CONV_OPS, TRANSPOSED) or kind == CONV_EPILOGUE.name:  # not seen: the twin takes them all
                why = f"--backend cuda does not take this convolution (--backend triton: {kind})"
            elif n.op in ("linear", "matmul"):
                why = (f"--backend cuda fuses only a Linear or x @ W with a 2-d weight parameter{PRODUCTS_NOTE} "
                       f"(--backend triton: {kind})")
            elif kind in (CONV_NORM.name, CONV_BN.name) and (n.op in POOLING or after_pooling(n, unfused)):
                why = (f"--backend triton fuses it in a {kind} region (a pool or mean after the norm, or an op after "
                       f"one); the CUDA version stops before the pool")
            elif kind == CONV_NORM.name:  # its CUDA version is off (or the convolution left it)
                why = f"--backend triton fuses it in a {kind} region; its CUDA version is off ({conv_norms.SWITCH}=0)"
            elif kind == CONV_POOL.name:  # its CUDA version is off
                why = (f"--backend triton fuses it in a {kind} region; its CUDA version is off unless "
                       f"{conv_pools.SWITCH}=1 (it met the contract on an H200 but lost its A/B to a torch pool)")
            elif kind in FUSED_KINDS:  # the kind has a CUDA version, but not for this region's GEMM
                why = (f"--backend triton fuses it in a {kind} region, whose GEMM --backend cuda does not take (not a "
                       f"Linear or x @ W with a 2-d weight parameter)")
            else:
                why = f"--backend triton fuses it in a {kind} region, which has no CUDA version yet"
            reasons[n.origin] = why
    return reasons


def cuda_kind(name: str) -> RegionKind:
    """The CUDA backend's fused kind of this name (its `cuda_code` writes the region's code)."""
    return next(k for k in FUSED if k.name == name)


def fused_ok(variants: Sequence[Variant]) -> bool:
    """Every fused region of every forward is of a kind this backend generates."""
    return all(r.kind in FUSED_KINDS for v in variants for r in v.regions if r.fused)
