"""The typer commands `kfuse eval`, `kfuse eval-suite` and `kfuse report` (registered in kfuse/cli.py).

Exit codes: 0 when the evaluation ran, whatever it found (the record says compiled/correct/flags);
1 with --require-correct when some candidate is not correct; 2 for bad input (REF, paths, options).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
import typer
from rich.console import Console

from kfuse.errors import KfuseError
from kfuse.judge.evaluate import EvalConfig, EvalRecord, evaluate
from kfuse.judge.report import cell, draw_png, fast_p_table, records_table
from kfuse.judge.suite import list_runs, load_run, run_suite
from kfuse.load import parse_set

console = Console()

DeviceOpt = typer.Option(None, "--device", help="cuda or cpu (default: cuda when available). Timing needs cuda.")
PrecisionOpt = typer.Option("fp32", "--precision", help="fp32 or bf16 (both sides run in it).")
TrialsOpt = typer.Option(5, "--trials", min=1, help="Fresh random draws at the given shape (plus extra shapes).")
PerfOpt = typer.Option(100, "--perf-trials", min=1, help="Timed runs per model (at least 30 are made).")
TimeoutOpt = typer.Option(300.0, "--timeout", min=1, help="Seconds for one candidate, start to finish.")
SeedOpt = typer.Option(None, "--seed", help="Base seed (default: random, recorded in the output).")
SetOpt = typer.Option([], "--set", help="Override a REF constant, NAME=VALUE (repeatable).")
RequireOpt = typer.Option(False, "--require-correct", help="Exit 1 unless every candidate is correct.")
UnsandboxedOpt = typer.Option(False, "--unsandboxed",
                              help="Run candidates without the bubblewrap sandbox (where it cannot start); "
                                   "the record says so. Only for candidates you trust.")


def _config(device: Optional[str], precision: str, trials: int, perf_trials: int, timeout: float,
            seed: Optional[int], set_: list[str], unsandboxed: bool = False) -> EvalConfig:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cuda", "cpu"):
        raise KfuseError(f"--device {device}: expected cuda or cpu")
    if precision not in ("fp32", "bf16"):
        raise KfuseError(f"--precision {precision}: expected fp32 or bf16")
    return EvalConfig(device=device, precision=precision, trials=trials, perf_trials=perf_trials,
                      timeout_s=timeout, seed=seed, overrides=parse_set(set_), sandboxed=not unsandboxed)


def _fmt(v: object, spec: str) -> str:
    return "-" if v is None else "inf" if v == float("inf") else format(v, spec)


def print_record(r: EvalRecord) -> None:
    verdict = "[green]correct[/]" if r.correct else "[red]not correct[/]" if r.compiled else "[red]did not compile[/]"
    console.print(f"[bold]{cell(r.problem)}[/] <- {cell(r.candidate)}: {verdict}  ({r.device}, {r.precision}, "
                  f"seed {r.seed}, {r.trials} checks at {cell(', '.join(r.shapes) or '-')})")
    if r.sandbox != "bwrap":
        console.print(f"  [yellow]sandbox: {cell(r.sandbox)}[/]")
    if r.compiled:
        console.print(f"  max abs err {_fmt(r.max_abs_err, '.3g')} (eager's own {_fmt(r.ref_max_abs_err, '.3g')}),"
                      f" Triton launches {r.triton_launches} {cell(', '.join(r.kernels))}")
    if r.runtime_ms is not None:
        console.print(f"  runtime {r.runtime_ms:.4f} ms | eager {_fmt(r.ref_runtime_ms, '.4f')} ms "
                      f"(x{_fmt(r.speedup_eager, '.2f')}) | torch.compile {_fmt(r.compile_runtime_ms, '.4f')} ms "
                      f"(x{_fmt(r.speedup_compile, '.2f')})")
    else:
        console.print(f"  timing unavailable: {r.timing.get('candidate', {}).get('reason') or 'not measured'}")
    for name, detail in r.flag_details.items():
        console.print(f"  [yellow]flag[/] {name}: {cell(detail, 2000)}")
    for line in r.failures[:5]:
        console.print(f"  [red]fail[/] {cell(line, 2000)}")
    if r.error:
        console.print(f"  [red]error[/] {cell(r.error, 4000)}")


def eval_cmd(
    ref: Path = typer.Argument(..., help="KernelBench problem file (defines Model, get_inputs, get_init_inputs)."),
    candidate: Path = typer.Argument(..., help="Candidate file defining ModelNew."),
    device: Optional[str] = DeviceOpt, precision: str = PrecisionOpt, trials: int = TrialsOpt,
    perf_trials: int = PerfOpt, timeout: float = TimeoutOpt, seed: Optional[int] = SeedOpt,
    set_: list[str] = SetOpt,
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the record as JSON here."),
    require_correct: bool = RequireOpt, unsandboxed: bool = UnsandboxedOpt,
) -> None:
    """Judge one candidate ModelNew against a reference problem, in a sandboxed worker process."""
    record = evaluate(ref, candidate, _config(device, precision, trials, perf_trials, timeout, seed, set_, unsandboxed))
    print_record(record)
    if json_path:
        json_path.write_text(json.dumps(record.to_json(), indent=2) + "\n")
    if require_correct and not record.correct:
        raise typer.Exit(1)


def eval_suite_cmd(
    ref_dir: Path = typer.Argument(..., help="Folder of problem files."),
    cand_dir: Path = typer.Argument(..., help="Folder of candidates, matched to problems by file name."),
    db: Path = typer.Option(Path("kfuse.db"), "--db", help="SQLite database the run is added to."),
    device: Optional[str] = DeviceOpt, precision: str = PrecisionOpt, trials: int = TrialsOpt,
    perf_trials: int = PerfOpt, timeout: float = TimeoutOpt, seed: Optional[int] = SeedOpt,
    set_: list[str] = SetOpt, require_correct: bool = RequireOpt, unsandboxed: bool = UnsandboxedOpt,
    jobs: int = typer.Option(1, "--jobs", min=1, help="Candidates judged side by side (imports, compilation and "
                                                      "correctness overlap; timings never do)."),
    ray: Optional[str] = typer.Option(None, "--ray", metavar="ADDRESS",
                                      help="Judge on a Ray cluster: 'local' starts one here, 'auto' joins the "
                                           "running one, or host:port / ray://host:port."),
) -> None:
    """Judge every candidate of a folder, compute fast_p, store the run in the database (record by record)."""
    cfg = _config(device, precision, trials, perf_trials, timeout, seed, set_, unsandboxed)
    result = run_suite(ref_dir, cand_dir, cfg, db, on_record=print_record, jobs=jobs, ray_address=ray)
    meta, records = load_run(db, result.run_id)
    console.print(records_table(meta, records))
    console.print(fast_p_table(meta))
    console.print(f"stored as run {result.run_id} in {db}")
    if require_correct and not all(r.correct for r in result.records):
        raise typer.Exit(1)


def report_cmd(
    db: Path = typer.Option(Path("kfuse.db"), "--db", help="SQLite database written by eval-suite."),
    run: Optional[int] = typer.Option(None, "--run", help="Run id (default: the latest)."),
    png: Path = typer.Option(Path("kfuse-report.png"), "--png", help="Where to draw the fast_p chart."),
    compare: int = typer.Option(1, "--compare", min=1, help="Draw this many latest runs on the chart."),
) -> None:
    """Print a suite run as a table and draw its fast_p chart."""
    meta, records = load_run(db, run)
    console.print(records_table(meta, records))
    console.print(fast_p_table(meta))
    runs = [meta] + [r for r in list_runs(db, compare) if r["id"] != meta["id"]][: compare - 1]
    console.print(f"chart: {draw_png(runs, png)}")
