"""`kfuse bench`: eager (as users run it, and strict fp32), torch.compile (default and max-autotune) and kfuse's
ModelNew, side by side.

For each problem, in one process on one GPU and on the same inputs (DESIGN.md, "Timing"):
  1. kfuse compiles the problem (capture, rewrite, partition, emit) and loads the generated file;
  2. the ModelNew's first call is timed on its own (Triton compilation + autotuning: `kfuse_first_call_s`,
     with the autotuner's share in `tune_s`);
  3. the ModelNew is checked against the accuracy contract (verify.check_contract, fresh draws + one extra shape);
  4. the five models are timed with timing.time_cuda: warm-up, >= 30 CUDA-event-timed runs with L2 flushed
     before each, median and p10/p90. torch.compile's first call (compilation, autotuning) is timed separately.
Every model is built under the same seed with the eager model's state loaded, and used as constructed (training
mode: BatchNorm uses batch statistics and updates its running statistics at each call, the same for all four).
`eager` runs under torch's default flags, as users run it (fp32 matmuls; cuDNN convolutions in TF32), and so do
torch.compile and kfuse; `eager_strict` with TF32 off for matmuls and cuDNN, the contract's fp32 reference. For
GEMM-only models the two are the same computation; for convolutions strict is 1-4x slower (facts). The contract's
`kernelbench_allclose` (allclose to default-flags eager at 1e-4, KernelBench's check) is reported per problem.

`--train` times a training step instead: parameters' gradients set to None, forward, backward for a fixed random
upstream gradient (the optimizer step is left out: it is the same torch code for all four). Its check is the
forward contract plus the gradient contract of kfuse.gradients (every parameter's and input's gradient, the
outputs and the buffers, rules 2 and 3), and `max_abs_err` is then the worst error of a gradient, output or
buffer against float64.

The functions here are pure where they can be (results are dataclasses; JSON, table and plot are made from them);
`bench_problem` takes its timer and compiler as arguments so that tests can drive it without a GPU.
"""

from __future__ import annotations

import math
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import typer

from kfuse.load import Problem
from kfuse.timing import MIN_RUNS, Timing, time_cuda, timing_unavailable

MODELS = ("eager", "eager_strict", "compile_default", "compile_max_autotune", "kfuse")
LABELS = {"eager": "eager", "eager_strict": "eager strict fp32", "compile_default": "torch.compile",
          "compile_max_autotune": "max-autotune", "kfuse": "kfuse"}
NO_GPU = "kfuse bench: no CUDA GPU available; benchmarks need one"

Progress = Callable[[str], None]


@dataclass
class BenchResult:
    """One problem's measurements. Timings are per call, in ms; `compile_s` is each model's first call."""

    problem: str
    constants: dict[str, Any]
    timings: dict[str, Timing]
    compile_s: dict[str, float]
    kfuse_first_call_s: float
    tune_s: float
    tuned: list[dict[str, Any]]
    correct: bool
    max_abs_err: float
    ref_max_abs_err: float
    rules: dict[str, Any]
    errors: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)  # the gradient contract's findings (--train)
    cuda_graph: bool | None = None  # whether kfuse's timed forward was a CUDA graph replay (kernels/graphs.py)
    gemm_configs: list[dict[str, Any]] = field(default_factory=list)  # every GEMM's tile config (TUNER's record)
    kernelbench_allclose: bool | None = None  # the contract's: every output allclose to default-flags eager

    def ms(self, model: str) -> float:
        t = self.timings.get(model)
        return t.median_ms if t is not None and t.available else float("nan")

    def speedup(self, baseline: str) -> float:
        """How many times faster kfuse is than `baseline` (medians); NaN when either is missing."""
        k, b = self.ms("kfuse"), self.ms(baseline)
        return b / k if k > 0 and not math.isnan(k) and not math.isnan(b) else float("nan")


def _num(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))) else v


def result_json(r: BenchResult) -> dict[str, Any]:
    """The required keys of benchmarks/*.json first, then spreads, speedups and compile/tuning times."""
    out: dict[str, Any] = {
        "problem": r.problem,
        "eager_ms": _num(r.ms("eager")),
        "compile_default_ms": _num(r.ms("compile_default")),
        "compile_max_autotune_ms": _num(r.ms("compile_max_autotune")),
        "kfuse_ms": _num(r.ms("kfuse")),
        "correct": r.correct,
        "max_abs_err": _num(r.max_abs_err),
    }
    out["ref_max_abs_err"] = _num(r.ref_max_abs_err)
    out["kernelbench_allclose"] = r.kernelbench_allclose
    out["eager_strict_ms"] = _num(r.ms("eager_strict"))
    out["speedup_vs_eager"] = _num(r.speedup("eager"))
    out["speedup_vs_eager_strict"] = _num(r.speedup("eager_strict"))
    out["speedup_vs_compile_default"] = _num(r.speedup("compile_default"))
    out["speedup_vs_compile_max_autotune"] = _num(r.speedup("compile_max_autotune"))
    out["timings"] = {m: r.timings[m].to_json() for m in MODELS if m in r.timings}
    out["compile_s"] = {m: round(s, 3) for m, s in r.compile_s.items()}
    out["kfuse_first_call_s"] = _num(round(r.kfuse_first_call_s, 3))
    out["tune_s"] = round(r.tune_s, 3)
    out["kfuse_cuda_graph"] = r.cuda_graph
    out["tuned"] = r.tuned
    out["gemm_configs"] = r.gemm_configs
    out["contract_rules"] = r.rules
    out["constants"] = r.constants
    if r.errors:
        out["errors"] = r.errors
    if r.failures:
        out["contract_failures"] = r.failures
    return out


def report_json(results: Sequence[BenchResult], command: str, runs: int, train: bool = False) -> dict[str, Any]:
    import triton

    import kfuse

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "command": command,
        "kfuse": kfuse.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "mode": "train" if train else "forward",
        "method": f"median of >= {runs} CUDA-event-timed calls after warm-up, 256 MB L2 flush before each; "
                  "eager, torch.compile and kfuse under torch's default flags (fp32 matmuls, TF32 cuDNN "
                  "convolutions), eager_strict with TF32 off everywhere; models in the mode the problem "
                  "constructs them (training)"
                  + ("; each call is a training step: grads set to None, forward, backward for a fixed upstream "
                     "gradient, no optimizer step" if train else ""),
        "results": [result_json(r) for r in results],
    }


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed (program name normalised to `kfuse`)."""
    argv = list(sys.argv if argv is None else argv)
    return shlex.join(["kfuse", *argv[1:]])


def _fmt_ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.3f}"


def _fmt_x(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}x"


def _fmt_bool(v: bool | None) -> str:
    return "-" if v is None else "yes" if v else "no"


def table_rows(results: Sequence[BenchResult]) -> list[list[str]]:
    """Rows of the printed table: ms (p10-p90) per model, kfuse's speedups, correctness and compile times."""
    rows = []
    for r in results:
        cells = [r.problem]
        for m in MODELS:
            t = r.timings.get(m)
            cells.append("-" if t is None or not t.available else f"{t.median_ms:.3f} ({t.p10_ms:.3f}-{t.p90_ms:.3f})")
        cells += [_fmt_x(r.speedup("eager")), _fmt_x(r.speedup("eager_strict")), _fmt_x(r.speedup("compile_default")),
                  _fmt_x(r.speedup("compile_max_autotune")),
                  f"{'yes' if r.correct else 'NO'} ({r.max_abs_err:.2g})", _fmt_bool(r.kernelbench_allclose),
                  f"{r.kfuse_first_call_s:.1f} / {r.tune_s:.1f}",
                  " / ".join(f"{r.compile_s[m]:.0f}" for m in ("compile_default", "compile_max_autotune")
                             if m in r.compile_s)]
        rows.append(cells)
    return rows


TABLE_COLUMNS = ["problem", "eager ms (p10-p90)", "strict ms", "compile ms", "max-autotune ms", "kfuse ms",
                 "vs eager", "vs strict", "vs compile", "vs max-autotune", "correct (max err)", "KB allclose",
                 "kfuse 1st call / tune s", "compile s (default / max-at)"]


def render_table(results: Sequence[BenchResult], title: str = "kfuse bench"):
    from rich.table import Table

    table = Table(title=title)
    for c in TABLE_COLUMNS:
        table.add_column(c, justify="left" if c == "problem" else "right")
    for row in table_rows(results):
        table.add_row(*row)
    return table


def write_plot(results: Sequence[BenchResult], path: Path, title: str = "") -> Path:
    """A PNG bar chart: one panel per problem (its own ms scale), a bar per model, kfuse's speedups above."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(results), 1)
    fig, axes = plt.subplots(1, n, figsize=(4.8 * n, 4.6), squeeze=False)
    colors = {"eager": "#7f7f7f", "eager_strict": "#bcbd22", "compile_default": "#1f77b4",
              "compile_max_autotune": "#9467bd", "kfuse": "#2ca02c"}
    for ax, r in zip(axes[0], results):
        vals = [r.ms(m) for m in MODELS]
        xs = range(len(MODELS))
        ax.bar(xs, [0 if math.isnan(v) else v for v in vals], color=[colors[m] for m in MODELS])
        for x, v in zip(xs, vals):
            ax.text(x, 0 if math.isnan(v) else v, "n/a" if math.isnan(v) else f"{v:.2f}", ha="center",
                    va="bottom", fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([LABELS[m] for m in MODELS], rotation=20, fontsize=8)
        ax.set_ylabel("ms per call (median)")
        ok = "" if r.correct else "  [FAILED contract]"
        ax.set_title(f"{r.problem}{ok}\nkfuse {_fmt_x(r.speedup('eager'))} vs eager, "
                     f"{_fmt_x(r.speedup('compile_max_autotune'))} vs max-autotune", fontsize=8)
        top = max([v for v in vals if not math.isnan(v)] or [1.0])
        ax.set_ylim(0, top * 1.15)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------------------------
# measuring
# ----------------------------------------------------------------------------------------------------------------
def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _first_call(fn: Callable[[], Any], device: str) -> float:
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def load_kfuse(problem: Problem, device: str, workdir: Path, autotune: str | None = None,
               backend: str = "triton") -> Any:
    """Compile the problem with kfuse and import the generated file (a fresh module). `autotune`: its tuner's mode
    ("on", "off" or "force": tune again, ignoring the disk cache); None keeps the one the environment gave
    (KFUSE_AUTOTUNE, read when the module loads). `backend`: "cuda" for CUDA C++ kernels (built on the first call:
    the first call's time then includes the build, or the load from the cache folder)."""
    from kfuse.optimize import Options, compile_problem, load_module

    compiled = compile_problem(problem, Options(device=device, backend=backend))
    path = workdir / f"{problem.name}_kfuse.py"
    path.write_text(compiled.source)
    module = load_module(path)
    tuner = getattr(module, "TUNER", None)  # absent where nothing is fused
    if autotune is not None and tuner is not None:
        tuner.mode = autotune
    return module


def graph_replayed(module: Any, model: torch.nn.Module) -> bool:
    """Whether the generated module replays `model`'s forward as a CUDA graph (kernels/graphs.py: only where it
    measured faster than the launches)."""
    kept = getattr(module, "graph_kept", None)  # absent where a torch fallback op keeps graphs out
    return bool(kept and kept(model))


def upstream_grads(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A fixed random gradient for each output of `model` (one forward to learn their shapes)."""
    from kfuse.verify import flatten

    with torch.no_grad():
        outs = flatten(model(*inputs))
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outs]


def step_fn(model: torch.nn.Module, inputs: Sequence[torch.Tensor],
            ups: Sequence[torch.Tensor] | None) -> Callable[[], Any]:
    """One timed call: a forward under no_grad (`ups` None), or a training step: grads to None, forward,
    backward for the upstream gradients `ups`."""
    from kfuse.verify import flatten

    if ups is None:
        def forward() -> Any:
            with torch.no_grad():
                return model(*inputs)
        return forward

    def step() -> None:
        model.zero_grad(set_to_none=True)
        torch.autograd.backward(flatten(model(*inputs)), ups)
    return step


def bench_problem(problem: Problem, *, device: str = "cuda", runs: int = MIN_RUNS, warmup: int = 5,
                  trials: int = 5, timer: Callable[..., Timing] = time_cuda,
                  compiler: Callable[..., Any] | None = None, progress: Progress = lambda msg: None,
                  workdir: Path | None = None, baselines: Sequence[str] = MODELS, train: bool = False,
                  autotune: str | None = None, backend: str = "triton") -> BenchResult:
    """Measure one problem (see the module docstring). `compiler` defaults to torch.compile; `timer` to
    timing.time_cuda; `baselines` may leave models out (they are then reported as missing); `train` times
    training steps and adds the gradient contract; `autotune`: the generated module's tuner mode (load_kfuse)."""
    from kfuse.gradients import GradVerdict, gradient_contract
    from kfuse.verify import DEFAULT_FLAGS, STRICT, backend_flags, check_contract, run_in_process

    compiler = compiler or torch.compile
    workdir = workdir or Path(tempfile.mkdtemp(prefix="kfuse-bench-"))
    name = problem.name
    errors: dict[str, str] = {}

    progress(f"{name}: kfuse: capture, rewrite, partition, emit")
    module = load_kfuse(problem, device, workdir, autotune, backend)

    def build(cls: type | None = None) -> torch.nn.Module:
        torch.manual_seed(0)
        return problem.build(cls=cls, device=device)

    eager = build()
    state = eager.state_dict()
    fused = build(module.ModelNew)
    fused.load_state_dict(state)
    torch.manual_seed(1)
    inputs = problem.inputs(device=device)

    timings: dict[str, Timing] = {}
    compile_s: dict[str, float] = {}
    log = module.TUNER.log if hasattr(module, "TUNER") else []
    log0 = len(log)
    progress(f"{name}: kfuse: first call (Triton compilation + autotuning)")
    ups = upstream_grads(eager, inputs) if train else None
    first = _first_call(step_fn(fused, inputs, ups), device)
    tuned = [dict(e) for e in log[log0:]]
    tune_s = sum(e.get("seconds", 0.0) for e in tuned)
    progress(f"{name}: kfuse: first call {first:.1f} s (tuning {tune_s:.1f} s); checking the accuracy contract "
             f"({trials} draws + 1 extra shape)")
    contract = check_contract(problem, run_in_process(module.ModelNew), device=device, trials=trials)
    progress(f"{name}: contract {'met' if contract.correct else 'FAILED'} "
             f"(max abs err {contract.max_abs_err:.3g}, eager {contract.ref_max_abs_err:.3g})")
    grads = GradVerdict()
    if train:
        progress(f"{name}: gradient contract (2 draws, against eager fp32 and float64)")
        grads = gradient_contract(problem, module.ModelNew, device=device, draws=2)
        progress(f"{name}: gradient contract {'met' if grads.correct else 'FAILED'} "
                 f"(max abs err {grads.max_abs_err:.3g}, eager {grads.ref_max_abs_err:.3g})")

    models: dict[str, Any] = {}
    if "eager" in baselines:
        models["eager"] = eager
    if "eager_strict" in baselines:
        strict = build()
        strict.load_state_dict(state)
        models["eager_strict"] = strict
    for key, mode in (("compile_default", None), ("compile_max_autotune", "max-autotune")):
        if key not in baselines:
            continue
        m = build()
        m.load_state_dict(state)
        models[key] = compiler(m) if mode is None else compiler(m, mode=mode)
    models["kfuse"] = fused

    for key, model in models.items():
        with backend_flags(STRICT if key == "eager_strict" else DEFAULT_FLAGS):
            fn = step_fn(model, inputs, ups)
            if key.startswith("compile"):
                progress(f"{name}: {LABELS[key]}: compiling (first call; max-autotune takes tens of seconds)")
                try:
                    compile_s[key] = _first_call(fn, device)
                except Exception as err:  # noqa: BLE001 - a baseline that fails is reported, not fatal
                    errors[key] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                    timings[key] = timing_unavailable(errors[key])
                    progress(f"{name}: {LABELS[key]}: FAILED: {errors[key]}")
                    continue
                progress(f"{name}: {LABELS[key]}: compiled in {compile_s[key]:.1f} s")
            progress(f"{name}: {LABELS[key]}: timing {runs} runs")
            timings[key] = timer(fn, warmup=warmup, runs=runs)
            progress(f"{name}: {LABELS[key]}: {_fmt_ms(timings[key].median_ms)} ms")
    constants = {k: v for k, v in problem.constants().items()}
    configs = module.TUNER.chosen_configs() if hasattr(module, "TUNER") else []
    if not train:
        return BenchResult(name, constants, timings, compile_s, first, tune_s, tuned, contract.correct,
                           contract.max_abs_err, contract.ref_max_abs_err, dict(contract.rules), errors,
                           cuda_graph=graph_replayed(module, fused), gemm_configs=configs,
                           kernelbench_allclose=contract.kernelbench_allclose)
    return BenchResult(name, constants, timings, compile_s, first, tune_s, tuned, contract.correct and grads.correct,
                       grads.max_abs_err, grads.ref_max_abs_err, {**contract.rules, **grads.rules}, errors,
                       grads.failures, gemm_configs=configs, kernelbench_allclose=contract.kernelbench_allclose)


def failed_result(problem: Problem, err: BaseException) -> BenchResult:
    """A problem whose kfuse side broke (compile, launch, contract run): reported as failing, the rest goes on."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    msg = f"{type(err).__name__}: {first}"[:500]
    return BenchResult(problem.name, dict(problem.constants()), {}, {}, float("nan"), 0.0, [], False,
                       float("nan"), float("nan"), {}, {"kfuse": msg})


# ----------------------------------------------------------------------------------------------------------------
# the command
# ----------------------------------------------------------------------------------------------------------------
def bench_cmd(
    problems: list[Path] = typer.Argument(..., help="Problem files (KernelBench format)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the results as JSON here."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG bar chart here."),
    set_: list[str] = typer.Option([], "--set", help="Override a module-level constant, NAME=VALUE "
                                                 "(repeatable; applies to every problem). Default: full size."),
    runs: int = typer.Option(MIN_RUNS, "--runs", min=MIN_RUNS, help="Timed runs per model."),
    warmup: int = typer.Option(5, "--warmup", min=1, help="Untimed warm-up calls per model."),
    trials: int = typer.Option(5, "--trials", min=1, help="Contract draws (plus one extra shape)."),
    retune: bool = typer.Option(False, "--retune", help="Ignore the autotune disk cache (tune again)."),
    train: bool = typer.Option(False, "--train", help="Time a training step (forward + backward, no optimizer "
                                                      "step) and check the gradient contract too."),
    baselines: str = typer.Option(",".join(m for m in MODELS if m != "kfuse"), "--baselines",
                                  help="Comma-separated models timed beside kfuse (eager, eager_strict, "
                                       "compile_default, compile_max_autotune); those left out are reported "
                                       "as missing."),
    backend: str = typer.Option("triton", "--backend", help="kfuse's kernels: triton (default) or cuda (CUDA C++ "
                                "built with load_inline; its build is part of the first call's time)."),
) -> None:
    """Time eager fp32, torch.compile (default, max-autotune) and kfuse's ModelNew side by side on one GPU."""
    from rich.console import Console

    from kfuse.commands import check_backend
    from kfuse.load import load_problem, parse_set

    console = Console(stderr=True)
    if not torch.cuda.is_available():
        typer.echo(NO_GPU, err=True)
        raise typer.Exit(2)
    chosen = tuple(b.strip() for b in baselines.split(",") if b.strip())
    unknown = [b for b in chosen if b not in MODELS or b == "kfuse"]
    if unknown:
        expected = [m for m in MODELS if m != "kfuse"]
        typer.echo(f"kfuse: error: --baselines {unknown[0]}: expected {', '.join(expected[:-1])} or {expected[-1]}",
                   err=True)
        raise typer.Exit(2)
    check_backend(backend, None)  # optimize's check: a KfuseError, one line and exit 2 (cli.py)
    overrides = parse_set(set_)
    loaded = [load_problem(p, overrides) for p in problems]  # every file is checked before the long part
    command = command_line()
    results: list[BenchResult] = []
    gpu = torch.cuda.get_device_name()
    title = f"kfuse bench{' --train (forward + backward)' if train else ''} on {gpu} (torch {torch.__version__})"
    with console.status("starting") as status:
        def progress(msg: str) -> None:
            status.update(msg)
            console.log(msg)

        for prob in loaded:
            try:
                results.append(bench_problem(prob, runs=runs, warmup=warmup, trials=trials, progress=progress,
                                             train=train, baselines=(*chosen, "kfuse"),
                                             autotune="force" if retune else None, backend=backend))
            except Exception as err:  # noqa: BLE001 - one broken problem must not lose the others' numbers
                results.append(failed_result(prob, err))
                progress(f"{prob.name}: FAILED: {results[-1].errors['kfuse']}")
            if json_path is not None:  # after each problem: a run cut short keeps what it measured
                import json

                json_path.parent.mkdir(parents=True, exist_ok=True)
                json_path.write_text(json.dumps(report_json(results, command, runs, train), indent=2) + "\n")
            if plot is not None:
                write_plot(results, plot, title)
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    Console(width=None if sys.stdout.isatty() else 220).print(render_table(results, title))  # logs: no wrapping
    if json_path is not None:
        console.print(f"wrote {json_path}")
    if plot is not None:
        console.print(f"wrote {plot}")
    if not all(r.correct for r in results):
        console.print("[red]kfuse bench: a kfuse model FAILED the accuracy contract (see 'correct')[/red]")
        raise typer.Exit(1)
