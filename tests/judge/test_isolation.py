"""Broken candidates give clean records (the judge survives them) and the suite goes on to the next one."""

from __future__ import annotations


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


def test_malformed_answer_is_a_record(records):
    rec = records["malformed_answer"]
    assert not rec.correct and "malformed answer" in rec.error


def test_oversized_answer_is_refused(records):
    rec = records["huge_output"]
    assert not rec.correct and "answer larger than" in rec.error


def test_log_flood_and_symlinked_log(records):
    for name in ("log_flood", "log_symlink"):
        rec = records[name]
        assert not rec.compiled and "exited with code 3" in rec.error and len(rec.error) < 2500, name


def test_log_tail_never_follows_a_symlink(tmp_path):
    from kfuse.judge.ipc import read_tail

    link = tmp_path / "worker.log"
    link.symlink_to("/dev/zero")
    assert read_tail(link, 100) == ""
    (tmp_path / "big.log").write_bytes(b"x" * 10_000 + b"\x1b[2Jend")
    assert read_tail(tmp_path / "big.log", 20).endswith("[2Jend") and "\x1b" not in read_tail(tmp_path / "big.log", 20)


def test_markup_and_escapes_never_reach_the_terminal(tmp_path, suite_folders):
    from typer.testing import CliRunner

    from kfuse.cli import app

    refs, cands = suite_folders({"scale_relu": ("scale_relu", "markup_error")})
    db = tmp_path / "k.db"
    runner = CliRunner()
    res = runner.invoke(app, ["eval-suite", str(refs), str(cands), "--db", str(db), "--device", "cpu",
                              "--trials", "1", "--seed", "1", "--unsandboxed"])
    assert res.exit_code == 0, res.output
    rep = runner.invoke(app, ["report", "--db", str(db), "--png", str(tmp_path / "r.png")])
    assert rep.exit_code == 0, rep.output
    for out in (res.output, rep.output):
        assert "run 1" in out and "fast_0" in out  # the table and fast_p were drawn
        assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out


def test_each_record_is_committed_as_it_is_judged(tmp_path, suite_folders):
    """The judge dies after the first record: that record is in the database, and report shows the run."""
    from kfuse.judge.evaluate import EvalConfig
    from kfuse.judge.suite import load_run, run_suite

    refs, cands = suite_folders({name: ("scale_relu", "honest_scale") for name in ("a", "b")})

    def die(record):
        raise KeyboardInterrupt

    db = tmp_path / "k.db"
    try:
        run_suite(refs, cands, EvalConfig(trials=1, seed=7, timeout_s=120, sandboxed=False), db, on_record=die)
    except KeyboardInterrupt:
        pass
    meta, rows = load_run(db)
    assert [r["problem"] for r in rows] == ["a"] and rows[0]["correct"]
    assert not meta["finished"] and meta["fast_p"]["fast_0"] == 1.0


def test_jobs_judge_side_by_side_with_the_same_records(tmp_path, suite_folders):
    from kfuse.judge.evaluate import EvalConfig
    from kfuse.judge.suite import load_run, run_suite

    refs, cands = suite_folders({"a": ("scale_relu", "honest_scale"), "b": ("scale_relu", "raises"),
                                 "c": ("scale_relu", "honest_scale")})
    cfg = EvalConfig(trials=1, seed=3, timeout_s=120, sandboxed=False)
    result = run_suite(refs, cands, cfg, tmp_path / "k.db", jobs=3)
    assert [r.problem for r in result.records] == ["a", "b", "c"]
    assert [r.correct for r in result.records] == [True, False, True]
    meta, rows = load_run(tmp_path / "k.db")
    assert meta["finished"] and len(rows) == 3 and result.fast_p["fast_0"] == 2 / 3


def test_suite_goes_on_after_a_crash(tmp_path, suite_folders):
    from kfuse.judge.evaluate import EvalConfig
    from kfuse.judge.report import draw_png
    from kfuse.judge.suite import list_runs, load_run, run_suite

    refs, cands = suite_folders({"linear_relu": ("linear_relu", "segfault"),
                                 "scale_relu": ("scale_relu", "honest_scale"), "missing": ("linear_relu", None)})
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
