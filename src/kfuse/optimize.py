"""`kfuse optimize`: the pipeline as a short list of named passes.

    load (kfuse.load)        the problem file, constants overridden by --set
    capture                  torch.fx trace -> canonical ops, shapes from one run of a copy of the model
    rewrite                  exact algebraic rewrites (rules as data)
    partition                GEMM-anchored regions; everything else stays a torch call
    modes (kfuse.modes)      rewrite + partition once per forward: two where a Dropout follows the mode
    strict                   --strict: any op left as a torch call is an error
    emit                     the standalone ModelNew source (codegen per region kind)
    verify                   the accuracy contract on fresh draws and one extra shape
    time                     on a GPU: eager vs kfuse, CUDA events, L2 flushed
"""

from __future__ import annotations

import importlib.util
import itertools
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import triton

import kfuse
from kfuse.capture import capture_with_modes
from kfuse.emit import emit
from kfuse.errors import UnsupportedError
from kfuse.ir import Graph
from kfuse.load import Problem
from kfuse.modes import Variant, primary, variants
from kfuse.partition import Region
from kfuse.verify import ContractReport, check_contract, run_in_process

SCHEME_BY_DEVICE = {"cuda": "fp16x3p", "cpu": "ieee"}
_counter = itertools.count()


@dataclass(frozen=True)
class Options:
    device: str = "cpu"
    precision: str = "fp32"
    strict: bool = False
    trials: int = 5
    seed: int = 0
    scheme: str | None = None  # GEMM scheme on the GPU; None: the default for the device


@dataclass
class Compiled:
    """What the pipeline made of a problem, before verification."""

    source: str
    variants: tuple[Variant, ...]  # every forward ModelNew has (two where a Dropout follows the mode)

    # graph, regions, rewrites, unfused and mode: of the forward the model runs as constructed (modes.primary)
    @property
    def main(self) -> Variant:
        return primary(self.variants)

    @property
    def graph(self) -> Graph:
        return self.main.graph

    @property
    def regions(self) -> list[Region]:
        return list(self.main.regions)

    @property
    def rewrites(self) -> list[str]:
        return list(self.main.rewrites)

    @property
    def unfused(self) -> list[str]:
        return self.main.unfused

    @property
    def mode(self) -> str:
        return self.main.mode


@dataclass
class Result:
    compiled: Compiled
    contract: ContractReport
    candidate_path: Path
    timings_ms: dict[str, float] = field(default_factory=dict)


def capture_problem(problem: Problem, device: str) -> Graph:
    """The problem's graph with every value's shape. Capture needs shapes, not values, so the model and its
    inputs are first built on the meta device (no memory, no random init: a 32768 x 32768 Linear costs
    nothing instead of seconds of CPU init and a shape-propagation GEMM); a model that cannot be built or run
    there (a constructor or forward that reads values) is captured for real on `device`."""
    try:
        return capture_with_modes(problem.build(device="meta"), problem.inputs(device="meta"))
    except Exception:  # noqa: BLE001 - any failure on meta just means "capture it for real"
        return capture_with_modes(problem.build(device=device), problem.inputs(device=device))


def compile_problem(problem: Problem, opts: Options) -> Compiled:
    vs = variants(capture_problem(problem, opts.device))
    compiled = Compiled("", vs)
    if opts.strict and compiled.unfused:
        raise UnsupportedError(f"{problem.path}: --strict: not fused: {', '.join(compiled.unfused)}")
    scheme = opts.scheme or SCHEME_BY_DEVICE.get(opts.device, "ieee")
    compiled.source = emit(problem.source, problem.path.name, vs, scheme)
    return compiled


def load_module(path: Path) -> types.ModuleType:
    """Import a generated file under a fresh name (Triton reads kernel source from the file)."""
    spec = importlib.util.spec_from_file_location(f"kfuse_generated_{next(_counter)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_models(problem: Problem, model_new_cls: type, device: str) -> dict[str, float]:
    from kfuse.timing import time_cuda

    torch.manual_seed(0)
    eager = problem.build(device=device)
    torch.manual_seed(0)
    fused = problem.build(cls=model_new_cls, device=device)
    fused.load_state_dict(eager.state_dict())
    inputs = problem.inputs(device=device)
    out: dict[str, float] = {}
    with torch.no_grad():
        for name, model in (("eager", eager), ("kfuse", fused)):
            out[name] = time_cuda(lambda m=model: m(*inputs)).median_ms
    return out


def optimize(problem: Problem, opts: Options, workdir: Path | None = None) -> Result:
    compiled = compile_problem(problem, opts)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="kfuse-"))
    candidate = workdir / f"{problem.name}_candidate.py"
    candidate.write_text(compiled.source)
    module = load_module(candidate)
    contract = check_contract(problem, run_in_process(module.ModelNew), device=opts.device,
                              precision=opts.precision, trials=opts.trials, seed=opts.seed)
    result = Result(compiled, contract, candidate)
    if opts.device == "cuda" and contract.correct:
        result.timings_ms = time_models(problem, module.ModelNew, opts.device)
    return result


def forward_json(v: Variant) -> dict[str, Any]:
    """One forward's `regions`, `unfused_ops` and `rewrites` report keys."""
    return {"regions": [{"kind": r.kind, "ops": [n.origin for n in r.nodes]} for r in v.regions],
            "unfused_ops": v.unfused, "rewrites": list(v.rewrites)}


def report(problem: Problem, opts: Options, result: Result, output: Path | None) -> dict[str, Any]:
    """The JSON report (keys documented in README.md)."""
    c, k = result.contract, result.compiled
    rep: dict[str, Any] = {
        "problem": problem.name,
        "device": opts.device if opts.device != "cuda" else torch.cuda.get_device_name(),
        "precision": opts.precision,
        "correct": c.correct,
        "rules": c.rules,
        "max_abs_err": c.max_abs_err,
        "ref_max_abs_err": c.ref_max_abs_err,
        "trials": c.trials,
        **forward_json(k.main),
        "mode": k.mode,
        "modes": {v.mode: forward_json(v) for v in k.variants if v.mode != "any"},
        "output": str(output) if output is not None else None,
        "overrides": dict(problem.overrides),
        "extra_shape": c.extra_shape,
        "failures": c.failures,
        "versions": {"kfuse": kfuse.__version__, "torch": torch.__version__, "triton": triton.__version__},
    }
    if result.timings_ms:
        rep["timings_ms"] = result.timings_ms
    return rep
