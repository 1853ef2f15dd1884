"""The region kinds, in admission order: the registry partition walks and codegen dispatches on.

Each kind is one object in one file of this folder (kfuse/regions/kind.py says what a kind does). Adding a kind
is its file plus one line here. Order matters: a node anchors a region of the first kind that `starts` there (the
last, `torch_call`, takes any node), and a GEMM epilogue walk is taken over by the first kind that `enters`.
"""

from __future__ import annotations

from collections.abc import Sequence

from kfuse.ir import Graph, Region
from kfuse.regions import (
    conv_batchnorm,
    conv_channel_reduce,
    conv_epilogue,
    conv_groupnorm,
    conv_pool,
    conv_rownorm,
    gemm_batchnorm,
    gemm_epilogue,
    gemm_groupnorm,
    gemm_groupnorm_wide,
    gemm_pool,
    gemm_rowreduce,
    gemm_rowsum,
    no_kernel,
    torch_call,
)
from kfuse.regions.common import RegionCode
from kfuse.regions.kind import RegionKind

KINDS: tuple[RegionKind, ...] = (
    gemm_rowsum.KIND,  # the row sum of a GEMM, rewritten to a GEMV (rewrite.py)
    gemm_epilogue.KIND,  # a GEMM and pointwise ops: where every GEMM region starts
    gemm_rowreduce.KIND,  # ... taken over at a reduction or norm over the whole feature row
    gemm_pool.KIND,  # ... at a pool over the features
    gemm_groupnorm.KIND,  # ... at a GroupNorm whose groups a column tile holds whole
    gemm_groupnorm_wide.KIND,  # ... at any other GroupNorm
    gemm_batchnorm.KIND,  # ... at a BatchNorm1d
    conv_epilogue.KIND,  # a convolution and pointwise ops
    conv_batchnorm.KIND,  # ... taken over at a BatchNorm over its channels
    conv_pool.KIND,  # ... at a pool over its spatial dims (windows, or a global mean)
    conv_groupnorm.KIND,  # ... at a GroupNorm or InstanceNorm over its channels
    conv_rownorm.KIND,  # ... at a LayerNorm or softmax over rows of its trailing dims
    conv_channel_reduce.KIND,  # ... at a reduction or softmax over its channels (dim 1)
    no_kernel.KIND,  # host values and views: nothing to launch
    torch_call.KIND,  # anything else: the torch call as written
)
_BY_NAME = {k.name: k for k in KINDS}


def kind_of(name: str) -> RegionKind:
    return _BY_NAME[name]


def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    return kind_of(region.kind).generate(region, g, stem)


def call_time_rewrites(regions: Sequence[Region], kinds: Sequence[RegionKind] = KINDS) -> list[str]:
    """Exact rewrites the generated launchers apply when ModelNew runs (they depend on state only known then,
    e.g. BatchNorm's mode): listed in the report with rewrite.py's. `kinds`: the backend's (a CUDA twin may apply
    none where its registry kind does)."""
    by_name = {k.name: k for k in kinds}
    return [rule for r in regions for rule in by_name[r.kind].call_time_rewrites(r)]
