"""User files are safe: -o and --json never overwrite the problem file (by any name: hard link, symlink), each
other, or a file kfuse did not write (without --force); unusable paths are one line and exit 2, before any work."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from kfuse.cli import app
from kfuse.commands import is_kfuse_json, same_file
from kfuse_testing import SEEDS, write_problem

P12 = SEEDS / "12_gemm_multiply_leakyrelu.py"


@pytest.fixture
def problem(tmp_path):
    path = tmp_path / "p12.py"
    shutil.copyfile(P12, path)
    return path


SMALL = ["--device", "cpu", "--trials", "1", "--set", "batch_size=4", "--set", "in_features=8",
         "--set", "out_features=16"]


def optimize(*args) -> object:
    """kfuse optimize at a tiny size: were a check missing, the test would fail in seconds, not hang."""
    return CliRunner().invoke(app, ["optimize", *map(str, args), *SMALL])


def assert_one_line_exit_2(res, message: str) -> None:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kfuse: error: ") and message in lines[0], res.stderr
    assert "Traceback" not in res.output


def test_json_never_overwrites_the_problem_file(problem):
    before = problem.read_text()
    for force in ([], ["--force"]):
        assert_one_line_exit_2(optimize(problem, "--json", problem, *force), "is the problem file")
    assert problem.read_text() == before


@pytest.mark.parametrize("flag", ["--json", "-o"])
@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_a_link_to_the_problem_file_is_the_problem_file(problem, tmp_path, flag, link):
    alias = tmp_path / "alias.py"
    (os.link if link == "hard" else os.symlink)(problem, alias)
    before = problem.read_text()
    assert_one_line_exit_2(optimize(problem, flag, alias, "--force"), "is the problem file")
    assert problem.read_text() == before


def test_json_never_overwrites_a_foreign_file(problem, tmp_path):
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": 1}\n')
    assert_one_line_exit_2(optimize(problem, "--json", foreign), "was not written by kfuse; pass --force")
    assert foreign.read_text() == '{"mine": 1}\n'


def test_json_and_output_must_differ(problem, tmp_path):
    out = tmp_path / "new.py"
    assert_one_line_exit_2(optimize(problem, "-o", out, "--json", out, "--force"), "is the -o/--output file")


@pytest.mark.parametrize("flag", ["--json", "-o"])
def test_a_folder_is_refused(problem, tmp_path, flag):
    assert_one_line_exit_2(optimize(problem, flag, tmp_path), "is a folder")


@pytest.mark.parametrize("flag", ["--json", "-o"])
def test_an_output_folder_that_cannot_be_made(problem, tmp_path, flag):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    res = optimize(problem, flag, blocker / "sub" / "out.json")
    assert_one_line_exit_2(res, f"cannot create the {flag if flag == '--json' else '-o/--output'} folder")
    assert "optimizing" not in res.output  # refused before any work


def test_a_forward_that_raises_is_one_line(tmp_path):
    path = write_problem(tmp_path, "pass", "raise ValueError('boom in forward')", name="raising")
    res = CliRunner().invoke(app, ["optimize", str(path), "--device", "cpu", "-o", str(tmp_path / "new.py")])
    assert_one_line_exit_2(res, f"{path}: Model.forward raised ValueError: boom in forward")


def test_same_file_compares_identity(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("x = 1\n")
    os.link(a, tmp_path / "hard.py")
    os.symlink(a, tmp_path / "sym.py")
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "sub", tmp_path / "sublink")
    assert same_file(a, tmp_path / "hard.py") and same_file(tmp_path / "sym.py", a)
    assert same_file(tmp_path / "sub" / ".." / "a.py", a)
    assert same_file(tmp_path / "sub" / "new.json", tmp_path / "sublink" / "new.json")  # neither exists yet
    assert not same_file(a, tmp_path / "b.py") and not same_file(tmp_path / "sub" / "a.py", a)


@pytest.mark.parametrize("text, ours", [
    ('{"kfuse_report": true, "problem": "p"}', True),
    ('[{"kfuse_report": true}, {"kfuse_report": true, "error": "x"}]', True),
    ('{"problem": "p", "versions": {"kfuse": "0.1", "torch": "2"}}', True),  # a report from before the mark
    ('{"kfuse_report": false}', False),
    ('[{"kfuse_report": true}, {"other": 1}]', False),
    ("[]", False),
    ("{}", False),
    ("not json", False),
])
def test_is_kfuse_json(tmp_path, text, ours):
    path = tmp_path / "r.json"
    path.write_text(text)
    assert is_kfuse_json(path) is ours


def test_a_report_kfuse_wrote_is_marked(problem, tmp_path):
    report = tmp_path / "r.json"
    res = optimize(problem, "-o", tmp_path / "new.py", "--json", report)
    assert res.exit_code == 0, res.output
    assert json.loads(report.read_text())["kfuse_report"] is True and is_kfuse_json(report)
