"""Code generators, one file per region kind; `generate` dispatches on `Region.kind`."""

from __future__ import annotations

from kfuse.ir import Graph
from kfuse.partition import Region
from kfuse.regions import gemm_epilogue, torch_fallback
from kfuse.regions.common import RegionCode

GENERATORS = {
    "gemm_epilogue": gemm_epilogue.generate,
    "torch": torch_fallback.generate,
}


def generate(region: Region, g: Graph) -> RegionCode:
    return GENERATORS[region.kind](region, g)
