"""`kfuse eval`, `eval-suite` and `report` through the CLI: JSON keys, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kfuse.cli import app

HERE = Path(__file__).parent
PROBLEM = HERE / "problems" / "scale_relu.py"
HONEST = HERE / "candidates" / "honest_scale.py"
JSON_KEYS = {"compiled", "correct", "flags", "max_abs_err", "runtime_ms", "ref_runtime_ms", "speedup_eager",
             "speedup_compile", "error"}
runner = CliRunner()


def test_eval_writes_the_documented_json(tmp_path):
    out = tmp_path / "rec.json"
    res = runner.invoke(app, ["eval", str(PROBLEM), str(HONEST), "--device", "cpu", "--trials", "1", "--seed", "3",
                              "--json", str(out), "--require-correct"])
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())
    assert JSON_KEYS <= set(rec)
    assert rec["compiled"] and rec["correct"] and rec["flags"] == [] and rec["error"] is None
    assert rec["runtime_ms"] is None  # CPU: timing unavailable, said so
    assert "timing unavailable" in res.output


def test_bad_reference_is_exit_2(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = (\n")
    for args in (["eval", str(bad), str(HONEST)], ["eval", str(PROBLEM), str(tmp_path / "nope.py")],
                 ["eval", str(PROBLEM), str(HONEST), "--device", "tpu"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output  # one line, its exit code, no traceback
        assert "Traceback" not in res.output and "error" in res.output.lower(), res.output


def test_suite_and_report(tmp_path, suite_folders):
    refs, cands = suite_folders({"scale_relu": ("scale_relu", "honest_scale")})
    db, png = tmp_path / "k.db", tmp_path / "r.png"
    res = runner.invoke(app, ["eval-suite", str(refs), str(cands), "--db", str(db), "--device", "cpu",
                              "--trials", "1", "--seed", "1"])
    assert res.exit_code == 0, res.output
    assert "fast_0" in res.output and "stored as run 1" in res.output
    res = runner.invoke(app, ["report", "--db", str(db), "--png", str(png)])
    assert res.exit_code == 0, res.output
    assert "scale_relu" in res.output and png.stat().st_size > 1000
    res = runner.invoke(app, ["report", "--db", str(tmp_path / "none.db")])
    assert res.exit_code == 2, res.output
