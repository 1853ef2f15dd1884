"""Broken candidates give clean records (the judge survives them) and the suite goes on to the next one."""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).parent
PROBLEMS, CANDIDATES = HERE / "problems", HERE / "candidates"


def test_syntax_error_is_not_compiled(records):
    rec = records["syntax_error"]
    assert not rec.compiled and not rec.correct and "SyntaxError" in rec.error


def test_exception_in_forward(records):
    rec = records["raises"]
    assert rec.compiled and not rec.correct and "RuntimeError" in rec.error


def test_crash_is_a_record(records):
    rec = records["segfault"]
    assert rec.compiled and not rec.correct and "SIGSEGV" in rec.error


def test_exit_is_a_record(records):
    rec = records["exits"]
    assert not rec.correct and "exited with code 3" in rec.error


def test_hang_times_out(records):
    rec = records["hang"]
    assert not rec.correct and rec.error.startswith("timeout")
    assert rec.elapsed_s < 30


def test_suite_goes_on_after_a_crash(tmp_path):
    from kfuse.judge.evaluate import EvalConfig
    from kfuse.judge.report import draw_png
    from kfuse.judge.suite import list_runs, load_run, run_suite

    refs, cands = tmp_path / "refs", tmp_path / "cands"
    refs.mkdir()
    cands.mkdir()
    for name in ("linear_relu", "scale_relu"):
        shutil.copy(PROBLEMS / f"{name}.py", refs / f"{name}.py")
    shutil.copy(PROBLEMS / "linear_relu.py", refs / "missing.py")
    shutil.copy(CANDIDATES / "segfault.py", cands / "linear_relu.py")
    shutil.copy(CANDIDATES / "honest_scale.py", cands / "scale_relu.py")
    db = tmp_path / "k.db"
    result = run_suite(refs, cands, EvalConfig(trials=2, seed=7, timeout_s=120), db)
    by = {r.problem: r for r in result.records}
    assert "SIGSEGV" in by["linear_relu"].error and by["scale_relu"].correct
    assert "no candidate" in by["missing"].error
    assert result.fast_p["fast_0"] == 1 / 3 and result.fast_p["fast_1"] is None  # no timing on the CPU

    meta, rows = load_run(db)
    assert meta["id"] == result.run_id and meta["gpu"] == "cpu" and meta["seed"] == 7
    assert meta["torch"] and meta["python"] and meta["n_problems"] == 3
    assert [r["problem"] for r in rows] == ["linear_relu", "missing", "scale_relu"]
    png = draw_png(list_runs(db), tmp_path / "chart.png")
    assert png.stat().st_size > 1000
