"""The issue's 'done when' on the CPU: each seed optimizes at small sizes, correct, fully fused."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kfuse.cli import app
from kfuse_testing import SEEDS, SMALL, requires_cuda

REPORT_KEYS = {"problem", "device", "precision", "correct", "rules", "max_abs_err", "ref_max_abs_err", "trials",
               "regions", "unfused_ops", "output"}
KINDS = {"12_gemm_multiply_leakyrelu": "gemm_epilogue", "62_matmul_groupnorm_leakyrelu_sum": "gemm_groupnorm",
         "39_gemm_scale_batchnorm": "gemm_batchnorm"}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_seed_optimizes_on_cpu(tmp_path, name):
    out, report = tmp_path / f"{name}_new.py", tmp_path / "r.json"
    sets = [a for k, v in SMALL[name].items() for a in ("--set", f"{k}={v}")]
    res = CliRunner().invoke(app, ["optimize", str(SEEDS / f"{name}.py"), "--device", "cpu", "-o", str(out),
                                   "--json", str(report), *sets])
    assert res.exit_code == 0, res.output
    rep = json.loads(report.read_text())
    assert REPORT_KEYS <= set(rep)
    assert rep["correct"] is True and all(rep["rules"].values())
    assert rep["problem"] == name and rep["output"] == str(out) and out.exists()
    assert [r["kind"] for r in rep["regions"]] == [KINDS[name]] and rep["unfused_ops"] == []
    assert rep["max_abs_err"] <= 2 * rep["ref_max_abs_err"] + 1e-7
    # running it again overwrites kfuse's own earlier output without --force
    again = CliRunner().invoke(app, ["optimize", str(SEEDS / f"{name}.py"), "--device", "cpu", "-o", str(out),
                                     "--trials", "1", *sets])
    assert again.exit_code == 0, again.output


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SMALL))
def test_seed_full_size_on_gpu(tmp_path, name):
    report = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["optimize", str(SEEDS / f"{name}.py"), "--device", "cuda",
                                   "-o", str(tmp_path / "new.py"), "--json", str(report)])
    assert res.exit_code == 0, res.output
    rep = json.loads(report.read_text())
    assert rep["correct"] and rep["timings_ms"]["kfuse"] < rep["timings_ms"]["eager"]


def test_kfuse_command_on_cpu_without_interpreter_env(tmp_path):
    """The installed command, as a user runs it: no TRITON_INTERPRET in the environment, `--device cpu`."""
    import os
    import subprocess
    import sys

    name = "12_gemm_multiply_leakyrelu"
    sets = [a for k, v in SMALL[name].items() for a in ("--set", f"{k}={v}")]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "new.py"
    proc = subprocess.run([sys.executable, "-m", "kfuse.cli", "optimize", str(SEEDS / f"{name}.py"), "--device", "cpu",
                           "--trials", "1", "-o", str(out), *sets], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.exists() and "Traceback" not in proc.stderr
