"""`kfuse optimize`: the pipeline as a short list of named passes (`compile_problem`, then `optimize`).

    load (kfuse.load)        the problem file, constants overridden by --set
    capture                  torch.fx trace -> canonical ops, shapes from one run of a copy of the model
    rewrite                  exact algebraic rewrites (rules as data)
    partition                regions of the registry's kinds (kfuse/regions/); what no kind fuses stays a torch call
    modes (kfuse.modes)      rewrite + partition once per forward: two where a Dropout follows the mode
    strict                   --strict: any op left as a torch call is an error
    emit                     the standalone ModelNew source (each region's kind generates its code)
    verify                   the accuracy contract on fresh draws and one extra shape
    annotate                 the file's header gets the verification summary and the GEMM configs that ran
    time                     on a GPU: eager vs kfuse, CUDA events, L2 flushed
"""

from __future__ import annotations

import copy
import dataclasses
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
from kfuse.emit import emit, emit_original
from kfuse.errors import ProblemError, UnsupportedError
from kfuse.ir import Graph, Node, Region
from kfuse.kernels.runtime import scheme_for
from kfuse.load import Problem
from kfuse.modes import Variant, primary, variants
from kfuse.regions import KINDS as REGISTRY
from kfuse.regions import torch_call
from kfuse.regions.kind import RegionKind
from kfuse.trace import Untraceable, one_line
from kfuse.verify import ContractReport, check_contract, run_in_process

_counter = itertools.count()


@dataclass(frozen=True)
class Options:
    device: str = "cpu"
    precision: str = "fp32"
    strict: bool = False
    trials: int = 5
    seed: int = 0
    scheme: str | None = None  # GEMM scheme on the GPU; None: the default for the device
    backend: str = "triton"  # "cuda": CUDA C++ kernels built with load_inline (kfuse/cuda/)


@dataclass
class Compiled:
    """What the pipeline made of a problem, before verification."""

    source: str
    variants: tuple[Variant, ...]  # every forward ModelNew has (two where a Dropout follows the mode)
    fallback: str | None = None  # why ModelNew runs Model.forward unchanged (None: it runs the pipeline's forward)
    scheme: str = ""  # the GEMM scheme the regions run (emit's)
    backend: str = "triton"  # which backend generated the kernels (Options.backend)

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
    gemm_configs: list[dict[str, Any]] = field(default_factory=list)  # the tile configs verification ran


def capture_problem(problem: Problem, device: str) -> Graph:
    """The problem's graph with every value's shape. Capture needs shapes, not values, so the model and its
    inputs are first built on the meta device (no memory, no random init: a 32768 x 32768 Linear costs
    nothing instead of seconds of CPU init and a shape-propagation GEMM); a model that cannot be built or run
    there (a constructor or forward that reads values) is captured for real on `device`, after one eager call
    that shows the forward runs at all (a forward that raises is the user's to fix: ProblemError)."""
    try:
        return capture_with_modes(problem.build(device="meta"), problem.inputs(device="meta"))
    except Untraceable:
        raise
    except Exception:  # noqa: BLE001 - any other failure on meta just means "capture it for real"
        pass
    model, inputs = problem.build(device=device), problem.inputs(device=device)
    try:
        with torch.no_grad():
            copy.deepcopy(model)(*inputs)
    except Exception as err:  # noqa: BLE001 - the user's forward
        raise ProblemError(f"{problem.path}: Model.forward raised {one_line(err)}") from None
    try:
        return capture_with_modes(model, inputs)
    except Untraceable:
        raise
    except Exception as err:  # noqa: BLE001 - the traced graph did not run as the forward does
        raise Untraceable(f"kfuse could not capture Model.forward ({one_line(err)})") from None


def original_forward(reason: str) -> tuple[Variant, ...]:
    """The one forward of a ModelNew that runs Model.forward unchanged, as the report describes it."""
    node = Node("forward", "unknown", (), (), origin="Model.forward")
    g = Graph((), (), (node,), ("forward",))
    return (Variant("any", g, (Region(torch_call.KIND.name, (node,), ("forward",)),), ()),)


def compile_problem(problem: Problem, opts: Options) -> Compiled:
    """The problem's ModelNew source: the pipeline up to emit, one pass a line (each pass's module says how)."""
    try:
        graph = capture_problem(problem, opts.device)  # capture: the model traced into canonical ops with shapes
    except Untraceable as why:  # ... or, where it cannot be traced, ModelNew is Model, and the report says why
        return _strict(compiled_original(problem, str(why), opts.backend), problem, opts)
    forwards = variants(graph, backend_kinds(opts.backend))  # modes: rewrite + partition, once per forward mode
    compiled = _strict(Compiled("", forwards, backend=opts.backend), problem, opts)  # strict: no op left unfused
    return _emit(compiled, problem, backend_scheme(opts))  # emit: the file


def backend_kinds(backend: str) -> tuple[RegionKind, ...]:
    """The region registry partition walks with: the Triton backend's, or the CUDA backend's (kfuse/cuda/)."""
    if backend == "cuda":
        from kfuse.cuda.regions import KINDS

        return KINDS
    return REGISTRY


def backend_scheme(opts: Options) -> str:
    """The GEMM scheme of the file: the CUDA backend runs fp16x3p (or its CUDA-core tile, --scheme ieee)
    wherever the file runs; the Triton one picks by device (runtime.scheme_for)."""
    if opts.backend == "cuda":
        return opts.scheme or "fp16x3p"
    return scheme_for(opts.scheme, opts.device == "cuda")


def _emit(compiled: Compiled, problem: Problem, scheme: str, verified: tuple[str, ...] = ()) -> Compiled:
    try:
        if compiled.backend == "cuda":
            from kfuse.cuda.emit import emit_cuda

            source = emit_cuda(problem.source, problem.path.name, compiled.variants, scheme, verified)
        else:
            source = emit(problem.source, problem.path.name, compiled.variants, scheme, verified)
    except Exception as err:  # noqa: BLE001 - a generator's own failure never costs the user a ModelNew
        return compiled_original(problem, f"kfuse could not generate code ({one_line(err)})", compiled.backend)
    return dataclasses.replace(compiled, source=source, scheme=scheme)


def _strict(compiled: Compiled, problem: Problem, opts: Options) -> Compiled:
    if opts.strict and compiled.unfused:
        why = f" ({compiled.fallback})" if compiled.fallback else ""
        raise UnsupportedError(f"{problem.path}: --strict: not fused: {', '.join(compiled.unfused)}{why}")
    return compiled


def compiled_original(problem: Problem, reason: str, backend: str = "triton") -> Compiled:
    return Compiled(emit_original(problem.source, problem.path.name, reason), original_forward(reason), reason,
                    backend=backend)


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


def _verify(problem: Problem, opts: Options, compiled: Compiled, candidate: Path) -> tuple[Any, ContractReport]:
    candidate.write_text(compiled.source)
    try:
        module = load_module(candidate)
        runner = run_in_process(module.ModelNew)
    except Exception as err:  # noqa: BLE001 - a generated file that does not import: a candidate that raised
        error = f"candidate raised {one_line(err)}"
        return None, check_contract(problem, _raising(error), device=opts.device, precision=opts.precision,
                                    trials=1, seed=opts.seed, extra_shape=False)
    return module, check_contract(problem, runner, device=opts.device, precision=opts.precision,
                                  trials=opts.trials, seed=opts.seed)


def gemm_configs(module: Any) -> list[dict[str, Any]]:
    """The GEMM tile configs the candidate's launches ran with in this process (its tuner's record)."""
    chosen = getattr(module, "chosen_configs", None)
    return list(chosen()) if callable(chosen) else []


def verification_lines(contract: ContractReport, configs: list[dict[str, Any]]) -> tuple[str, ...]:
    """The header's verification summary: errors against float64, the draws, and the GEMM configs that ran."""
    verdict = "meets" if contract.correct else "FAILS"
    lines = [f"Verified by kfuse: {verdict} the accuracy contract over {contract.trials} draws"
             f"{' and the extra shape ' + contract.extra_shape if contract.extra_shape else ''}: max abs error vs "
             f"float64 {contract.max_abs_err:.2e} (eager fp32: {contract.ref_max_abs_err:.2e})."]
    for c in configs:  # the tuner's rows (kernels/runtime.py, Tuner.chosen_configs)
        how = f"{c.get('name', c.get('config'))} ({c.get('source', '?')}, scheme {c.get('scheme', '?')})"
        lines.append(f"  GEMM tile of {c.get('kernel', '?')} at M, N, K = {c.get('shape')}: {how}")
    return tuple(lines)


def _annotate(compiled: Compiled, problem: Problem, contract: ContractReport, module: Any,
              candidate: Path) -> Compiled:
    """The verified file with its summary in the header (only comments change: the code is what was verified)."""
    if compiled.fallback is not None or module is None:
        return compiled
    done = _emit(compiled, problem, compiled.scheme, verification_lines(contract, gemm_configs(module)))
    if done.fallback is None:
        candidate.write_text(done.source)
        return done
    return compiled


def _raising(error: str) -> Any:
    def runner(*_: Any) -> Any:
        raise RuntimeError(error)
    return runner


def raised(contract: ContractReport) -> str | None:
    """The first exception the candidate raised in verification, or None."""
    return next((f for v in contract.verdicts for f in v.failures if f.startswith("candidate raised")), None)


def optimize(problem: Problem, opts: Options, workdir: Path | None = None) -> Result:
    """The whole pipeline: compile_problem's passes, then verify, annotate and (on a GPU) time."""
    candidate = (workdir or Path(tempfile.mkdtemp(prefix="kfuse-"))) / f"{problem.name}_candidate.py"
    compiled = compile_problem(problem, opts)  # capture .. emit
    module, contract = _verify(problem, opts, compiled, candidate)  # verify: the accuracy contract
    compiled, module, contract = _unless_raised(problem, opts, compiled, module, contract, candidate)  # ... else Model
    compiled = _annotate(compiled, problem, contract, module, candidate)  # annotate: the header's summary
    result = Result(compiled, contract, candidate, gemm_configs=gemm_configs(module) if module else [])
    if opts.device == "cuda" and contract.correct:  # time: eager against ModelNew, on a GPU
        result.timings_ms = time_models(problem, module.ModelNew, opts.device)
    return result


def _unless_raised(problem: Problem, opts: Options, compiled: Compiled, module: Any, contract: ContractReport,
                   candidate: Path) -> tuple[Compiled, Any, ContractReport]:
    """A fused ModelNew that raised is kfuse's own failure: the user still gets Model's forward, verified."""
    error = raised(contract)
    if error is None or compiled.fallback is not None:
        return compiled, module, contract
    why = f"the fused ModelNew failed to run ({error.removeprefix('candidate raised ')})"
    compiled = compiled_original(problem, why, compiled.backend)
    return (compiled, *_verify(problem, opts, compiled, candidate))


def forward_json(v: Variant) -> dict[str, Any]:
    """One forward's `regions`, `unfused_ops` and `rewrites` report keys."""
    return {"regions": [{"kind": r.kind, "fused": r.fused, "ops": [n.origin for n in r.nodes]} for r in v.regions],
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
        "allclose_reference": c.allclose_reference,
        "kernelbench_allclose": c.kernelbench_allclose,
        "trials": c.trials,
        **forward_json(k.main),
        "mode": k.mode,
        "fallback": k.fallback,
        "gemm_scheme": k.scheme or None,
        "gemm_configs": result.gemm_configs,
        "modes": {v.mode: forward_json(v) for v in k.variants if v.mode != "any"},
        "output": str(output) if output is not None else None,
        "overrides": dict(problem.overrides),
        "extra_shape": c.extra_shape,
        "failures": c.failures,
        "versions": {"kfuse": kfuse.__version__, "torch": torch.__version__, "triton": triton.__version__},
    }
    if result.timings_ms:
        rep["timings_ms"] = result.timings_ms
    rep["backend"] = k.backend
    if k.backend == "cuda" and k.fallback is None:
        from kfuse.cuda.regions import unfused_reasons

        rep["unfused_reasons"] = unfused_reasons(k.main)
    return rep
