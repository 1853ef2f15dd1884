"""`kfuse optimize` over several files or a folder: every problem gets a row, one failing problem never stops the
others, the exit code is the worst row's, --json holds every row."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kfuse.cli import app
from kfuse.commands import REPORT_MARK
from kfuse_testing import write_problem

SMALL = dict(batch=5, k=12, n=9)


def sweep_folder(tmp_path):
    """a/ with two tiny problems (one in a subfolder) and one whose forward raises."""
    root = tmp_path / "problems"
    (root / "sub").mkdir(parents=True)
    write_problem(root, "self.l = nn.Linear(in_features, out_features)", "return torch.relu(self.l(x))",
                  name="1_linear_relu", **SMALL)
    write_problem(root / "sub", "self.l = nn.Linear(in_features, out_features)", "return self.l(x) * 2.0",
                  name="2_linear_scale", **SMALL)
    write_problem(root, "pass", "raise ValueError('broken forward')", name="3_raises", **SMALL)
    return root


def test_a_folder_sweep_goes_on_past_a_failure(tmp_path):
    root = sweep_folder(tmp_path)
    out, rows_path = root / "out", tmp_path / "rows.json"  # ModelNew files inside the folder swept
    res = CliRunner().invoke(app, ["optimize", str(root), "--device", "cpu", "--trials", "1", "-o", str(out),
                                   "--json", str(rows_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 2, res.output  # the worst row: the raising forward is bad input
    rows = json.loads(rows_path.read_text())
    assert [r["problem"] for r in rows] == ["1_linear_relu", "3_raises", "2_linear_scale"]  # sorted paths
    assert all(r[REPORT_MARK] is True and {"exit", "seconds", "path"} <= set(r) for r in rows)
    good, bad = [r for r in rows if "error" not in r], [r for r in rows if "error" in r]
    assert [r["exit"] for r in good] == [0, 0] and all(r["correct"] and r["regions"] for r in good)
    assert sorted(p.name for p in out.iterdir()) == ["1_linear_relu_new.py", "2_linear_scale_new.py"]
    assert len(bad) == 1 and bad[0]["exit"] == 2
    assert bad[0]["error"].startswith("ProblemError: ")
    assert "Model.forward raised ValueError: broken forward" in bad[0]["error"]
    assert "Traceback" not in res.output
    table = res.stderr[res.stderr.index("kfuse optimize: 3 problems"):]
    assert all(word in table for word in ("problem", "exit", "correct", "regions", "unfused ops", "seconds",
                                          "1_linear_relu", "2_linear_scale", "3_raises"))
    # the same sweep again: kfuse's own ModelNew files are not problems, and they and the JSON are overwritten
    rows_path.write_text(json.dumps([{REPORT_MARK: True, "problem": "stale"}]))
    again = CliRunner().invoke(app, ["optimize", str(root), "--device", "cpu", "--trials", "1", "-o", str(out),
                                     "--json", str(rows_path)])
    assert again.exit_code == 2, again.output
    assert [r["problem"] for r in json.loads(rows_path.read_text())] == [r["problem"] for r in rows]


def test_several_files_need_an_output_folder(tmp_path):
    root = sweep_folder(tmp_path)
    files = [str(p) for p in sorted(root.glob("*.py"))]
    res = CliRunner().invoke(app, ["optimize", *files, "--device", "cpu", "-o", str(tmp_path / "new.py")])
    assert res.exit_code == 2 and "with several problems, -o/--output names a folder" in res.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(app, ["optimize", str(empty), "--device", "cpu"])
    assert res.exit_code == 2 and "no .py problem files" in res.stderr
