"""Helpers shared by the kfuse tests (seed paths, small sizes, a problem-file writer, the GPU mark)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "problems" / "seeds"

# Small, odd sizes for each seed: rows and columns straddle tile sizes, K is not a multiple of BLOCK_K.
SMALL = {
    "12_gemm_multiply_leakyrelu": {"batch_size": 37, "in_features": 70, "out_features": 129},
    "62_matmul_groupnorm_leakyrelu_sum": {"batch_size": 37, "input_size": 70, "hidden_size": 256, "num_groups": 16},
    "39_gemm_scale_batchnorm": {"batch_size": 37, "in_features": 70, "out_features": 129},
}

PROBLEM_TEMPLATE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
{init}

    def forward(self, x):
{forward}


batch_size = {batch}
in_features = {k}
out_features = {n}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return [in_features, out_features]
'''


def write_problem(tmp_path: Path, init: str, forward: str, *, batch: int = 37, k: int = 70, n: int = 129,
                  inputs: str = "torch.rand(batch_size, in_features)", name: str = "problem") -> Path:
    """A KernelBench-format problem file whose Model is `init` / `forward` (indented bodies, dedented here)."""
    body = PROBLEM_TEMPLATE.format(
        init=textwrap.indent(textwrap.dedent(init).strip("\n"), " " * 8),
        forward=textwrap.indent(textwrap.dedent(forward).strip("\n"), " " * 8),
        batch=batch, k=k, n=n, inputs=inputs)
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    return path


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
