"""Code generators, one file per region kind; `generate` dispatches on `Region.kind`."""

from __future__ import annotations

from collections.abc import Sequence

from kfuse.ir import Graph
from kfuse.partition import Region
from kfuse.regions import (gemm_batchnorm, gemm_epilogue, gemm_groupnorm, gemm_groupnorm_wide, gemm_pool, gemm_rowreduce,
                           gemv, torch_fallback)
from kfuse.regions.common import RegionCode

GENERATORS = {
    "gemm_epilogue": gemm_epilogue.generate,
    "gemm_groupnorm": gemm_groupnorm.generate,
    "gemm_groupnorm_wide": gemm_groupnorm_wide.generate,
    "gemm_batchnorm": gemm_batchnorm.generate,
    "gemm_rowreduce": gemm_rowreduce.generate,
    "gemm_pool": gemm_pool.generate,
    "gemv": gemv.generate,
    "torch": torch_fallback.generate,
    "view": torch_fallback.generate,
}


def generate(region: Region, g: Graph) -> RegionCode:
    return GENERATORS[region.kind](region, g)


def call_time_rewrites(regions: Sequence[Region]) -> list[str]:
    """Exact rewrites the generated launchers apply when ModelNew runs, one name per region that can apply one
    (they depend on state only known then, e.g. BatchNorm's mode): listed in the report with rewrite.py's."""
    return [gemm_batchnorm.FOLD_RULE for r in regions if r.kind == "gemm_batchnorm" and gemm_batchnorm.fold_plan(r)]
