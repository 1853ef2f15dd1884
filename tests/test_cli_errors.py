"""The loader's errors through the command line, in a fresh process: one line naming the file, exit code 2, no
traceback (the loader itself is tested device-free in tests/unit/test_load.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kfuse_testing import SEEDS, write_problem

GOOD = SEEDS / "12_gemm_multiply_leakyrelu.py"


def run_kfuse(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kfuse.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=600)


@pytest.mark.parametrize("args, message", [
    (["optimize", "missing.py"], "missing.py: file not found"),
    (["optimize", str(GOOD), "--set", "batch_size=abc"], "--set batch_size=abc: value is not a number"),
    (["optimize", str(GOOD), "--set", "nope=3"], "--set nope: no module-level constant"),
    (["optimize", str(GOOD), "--device", "tpu"], "--device tpu: expected cuda or cpu"),
])
def test_cli_bad_input_is_one_line_exit_2(args, message):
    res = run_kfuse(*args)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_cli_constructor_error_one_line(tmp_path):
    path = write_problem(tmp_path, "raise ValueError('bad size')", "return x")
    res = run_kfuse("optimize", str(path), "--device", "cpu")
    assert res.returncode == 2 and "raised ValueError: bad size" in res.stderr and "Traceback" not in res.stderr
