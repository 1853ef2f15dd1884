"""Helpers shared by the kfuse tests (seed paths, small sizes, a problem-file writer and compiler, the GPU mark)."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

from kfuse.gradients import gradient_contract
from kfuse.library import bound_names
from kfuse.load import Problem, load_problem
from kfuse.optimize import Compiled, Options, compile_problem, load_module

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


# A convolution problem: Model() with the `init` and `forward` bodies, one input of shape (batch_size, x_shape)
CONV_PROBLEM = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, x):
{forward}


batch_size = {batch}


def get_inputs():
    return [torch.randn(batch_size, {x_shape})]


def get_init_inputs():
    return []
'''


def write_conv_problem(tmp_path: Path, name: str, init: str, forward: str, x_shape: str, batch: int = 3) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(CONV_PROBLEM.format(init=textwrap.indent(init, " " * 8), forward=textwrap.indent(forward, " " * 8),
                                        batch=batch, x_shape=x_shape))
    return path


def gradient_verdict(prob: Problem, compiled: Compiled, tmp_path: Path):
    """The gradient contract (one draw) of the compiled problem's ModelNew."""
    out = tmp_path / f"{prob.name}_new.py"
    out.write_text(compiled.source)
    return gradient_contract(prob, load_module(out).ModelNew, draws=1)


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def generate_model(tmp_path: Path, init: str, forward: str, name: str, device: str = "cpu", **sizes):
    """write_problem, then kfuse's compile and import of its ModelNew file: (problem, compiled, module)."""
    prob = load_problem(write_problem(tmp_path, init, forward, name=name, **sizes))
    compiled: Compiled = compile_problem(prob, Options(device=device))
    path = tmp_path / f"{name}_new.py"
    path.write_text(compiled.source)
    return prob, compiled, load_module(path)


def graphed_pair(prob: Problem, module, monkeypatch) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Eager Model and ModelNew on the GPU from the same state, with every CUDA graph kept (whether one pays is
    a timing, measured by the bench, not asserted by tests)."""
    monkeypatch.setattr(module, "replay_pays", lambda *args, **kwargs: True)
    torch.manual_seed(0)
    ref = prob.build(device="cuda")
    new = prob.build(cls=module.ModelNew, device="cuda")
    new.load_state_dict(ref.state_dict())
    return ref, new


LONGEST_LINE = 200  # issue 19: no generated line longer than this


def long_lines(source: str) -> list[str]:
    """The generated lines longer than LONGEST_LINE (their first 80 characters)."""
    return [line[:80] for line in source.splitlines() if len(line) > LONGEST_LINE]


def unreached_names(source: str, library: range, roots_from: range | None = None,
                    extra_roots: Iterable[str] = ()) -> list[str]:
    """Top-level names a generated file binds in its copied library (statements starting on a line of `library`,
    1-based) that nothing outside it reads, directly or through other library definitions (names read, as Python
    resolves globals; attribute names do not count). The roots: every other statement starting on a line of
    `roots_from` (default: anywhere), and `extra_roots` (what kfuse itself reads from the module)."""
    reads_of: dict[str, set[str]] = {}
    roots: set[str] = set(extra_roots)
    for stmt in ast.parse(source).body:
        reads = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        names = bound_names(stmt)
        if stmt.lineno in library and names:
            for name in names:
                reads_of.setdefault(name, set()).update(reads)
        elif roots_from is None or stmt.lineno in roots_from:
            roots |= reads
    reached: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(reads_of.get(name, ()))
    return sorted(set(reads_of) - reached)


def tuned_stats_launch(problem: str, stem: str) -> str:
    """The generated source of problems/conv/<problem> (batch 2, CPU) checked for a statistics pass whose launch is
    a function of the tile (regions/conv_common.tuned_launch: tuned, then run at the pick, returning its partials);
    returns that function's body, where the partials must be allocated."""
    source = compile_problem(load_problem(ROOT / "problems" / "conv" / problem, {"batch_size": 2}),
                             Options(device="cpu")).source
    head = source.index(f"def {stem}_launch(cfg):")
    assert f"cfg = tuned_conv({stem}_kernel, geo, scheme, cfg, x," in source
    assert f"mean_part, m2_part, count = {stem}_launch(cfg)" in source
    return source[head:source.index("return mean_part, m2_part, count\n", head)]
