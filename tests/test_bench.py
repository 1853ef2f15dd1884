"""`kfuse bench`: the no-GPU exit, the measuring flow (driven on the CPU with a wall-clock timer and no
torch.compile), the JSON shape of benchmarks/*.json, the table and the PNG."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest
import torch

from kfuse.bench import (
    MODELS,
    NO_GPU,
    TABLE_COLUMNS,
    BenchResult,
    bench_problem,
    command_line,
    load_kfuse,
    report_json,
    result_json,
    table_rows,
    write_plot,
)
from kfuse.load import load_problem
from kfuse.timing import Timing, summarize
from kfuse_testing import ROOT, SEEDS, SMALL, requires_cuda

REQUIRED = {"problem", "eager_ms", "compile_default_ms", "compile_max_autotune_ms", "kfuse_ms", "correct",
            "max_abs_err"}


def wall_timer(fn, *, warmup: int = 1, runs: int = 30) -> Timing:
    """A CPU stand-in for time_cuda (few runs: the interpreter is slow)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return summarize(times)


def fake_result(name: str, ms: dict[str, float], correct: bool = True) -> BenchResult:
    timings = {m: Timing(v, v * 0.9, v * 1.2, v * 0.95, v * 1.05, 30) for m, v in ms.items()}
    return BenchResult(name, {"batch_size": 1024}, timings, {"compile_default": 12.0, "compile_max_autotune": 40.0},
                       3.5, 2.5, [{"key": "k", "config": "128x128x64", "seconds": 2.5}], correct, 3e-6, 1.5e-5,
                       {"allclose": True})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_gpu_one_line_and_exit_2():
    res = subprocess.run([sys.executable, "-m", "kfuse", "bench", str(SEEDS / "12_gemm_multiply_leakyrelu.py")],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2
    assert res.stderr.strip() == NO_GPU
    assert res.stdout == ""


def test_json_shape_speedups_table_and_plot(tmp_path):
    results = [fake_result("12_gemm_multiply_leakyrelu",
                           {"eager": 2.7, "compile_default": 2.8, "compile_max_autotune": 2.8, "kfuse": 0.7}),
               fake_result("39_gemm_scale_batchnorm", {"eager": 11.5, "kfuse": 2.9}, correct=False)]
    rep = report_json(results, "kfuse bench problems/seeds/*.py", 30)
    assert {"gpu", "torch", "triton", "command", "results"} <= set(rep)
    assert rep["command"] == "kfuse bench problems/seeds/*.py"
    r0, r1 = rep["results"]
    assert REQUIRED <= set(r0) and list(r0)[:7] == ["problem", "eager_ms", "compile_default_ms",
                                                    "compile_max_autotune_ms", "kfuse_ms", "correct", "max_abs_err"]
    assert r0["problem"] == "12_gemm_multiply_leakyrelu" and r0["kfuse_ms"] == 0.7
    assert r0["speedup_vs_compile_max_autotune"] == pytest.approx(4.0)
    assert r0["timings"]["kfuse"]["p90_ms"] == pytest.approx(0.735) and r0["tune_s"] == 2.5
    # a baseline that did not run is null, never NaN (strict JSON)
    assert r1["compile_default_ms"] is None and r1["speedup_vs_compile_default"] is None
    json.loads(json.dumps(rep, allow_nan=False))
    rows = table_rows(results)
    correct_col = TABLE_COLUMNS.index("correct (max err)")
    assert rows[0][0] == "12_gemm_multiply_leakyrelu" and "3.86x" in rows[0] and rows[1][correct_col].startswith("NO")
    assert all(len(row) == len(TABLE_COLUMNS) for row in rows)
    png = write_plot(results, tmp_path / "b.png", "title")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_broken_problem_is_reported_not_fatal(tmp_path):
    from kfuse.bench import failed_result

    prob = load_problem(SEEDS / "12_gemm_multiply_leakyrelu.py", SMALL["12_gemm_multiply_leakyrelu"])
    r = failed_result(prob, RuntimeError("triton: out of resources\nmore"))
    rep = report_json([r], "kfuse bench x.py", 30)
    row = rep["results"][0]
    assert row["correct"] is False and row["kfuse_ms"] is None and row["errors"] == {
        "kfuse": "RuntimeError: triton: out of resources"}
    json.loads(json.dumps(rep, allow_nan=False))
    assert table_rows([r])[0][TABLE_COLUMNS.index("correct (max err)")].startswith("NO")
    assert write_plot([r], tmp_path / "f.png").exists()


def test_command_line_is_reproducible():
    assert command_line(["/x/bin/kfuse", "bench", "a b.py", "--json", "o.json"]) == "kfuse bench 'a b.py' --json o.json"


@pytest.mark.parametrize("name", ["12_gemm_multiply_leakyrelu", "39_gemm_scale_batchnorm"])
def test_bench_problem_flow_on_cpu(tmp_path, name):
    """The whole measuring flow in the interpreter: kfuse compiled, first call timed, contract checked, four
    models timed on the same inputs (the 'compiler' here returns the model as is)."""
    prob = load_problem(SEEDS / f"{name}.py", SMALL[name])
    compiled_modes = []

    def compiler(m, mode=None):
        compiled_modes.append(mode)
        return m

    msgs: list[str] = []
    r = bench_problem(prob, device="cpu", timer=wall_timer, compiler=compiler, progress=msgs.append,
                      trials=1, workdir=tmp_path)
    assert compiled_modes == [None, "max-autotune"]
    assert set(r.timings) == set(MODELS) and all(t.available for t in r.timings.values())
    assert r.correct and r.max_abs_err <= 2 * r.ref_max_abs_err + 1e-7
    assert r.kfuse_first_call_s > 0 and r.tune_s == 0 and r.tuned == []  # no tuning in the interpreter
    assert r.gemm_configs and all(c["source"] == "default" for c in r.gemm_configs)  # each GEMM's config
    assert result_json(r)["gemm_configs"] == r.gemm_configs
    assert not math.isnan(r.speedup("compile_max_autotune"))
    assert any("first call" in m for m in msgs) and any("contract met" in m for m in msgs)
    assert r.constants["batch_size"] == 37
    assert r.kernelbench_allclose is True and result_json(r)["kernelbench_allclose"] is True


def test_eager_as_users_run_it_and_strict_eager_are_timed_under_their_flags(tmp_path):
    """`eager`, torch.compile and kfuse run under torch's default flags (cuDNN TF32 allowed), `eager_strict`
    with TF32 off everywhere: the flags are read inside each timed call."""
    from kfuse.verify import DEFAULT_FLAGS, STRICT, BackendFlags

    name = "12_gemm_multiply_leakyrelu"
    prob = load_problem(SEEDS / f"{name}.py", SMALL[name])
    seen: list = []

    def timer(fn, **kw):
        seen.append(BackendFlags.current())
        return wall_timer(fn, **kw)

    before = BackendFlags.current()
    r = bench_problem(prob, device="cpu", timer=timer, compiler=lambda m, mode=None: m, trials=1, workdir=tmp_path)
    assert seen == [STRICT if m == "eager_strict" else DEFAULT_FLAGS for m in MODELS]
    assert BackendFlags.current() == before  # restored
    row = result_json(r)
    assert row["eager_strict_ms"] is not None and row["speedup_vs_eager_strict"] is not None


@pytest.mark.parametrize("name", ["39_gemm_scale_batchnorm"])
def test_bench_train_flow_on_cpu(tmp_path, name):
    """--train: every model timed on forward + backward steps; the gradient contract joins the forward one."""
    prob = load_problem(SEEDS / f"{name}.py", SMALL[name])
    steps = {"n": 0}

    def timer(fn, **kw):
        fn()
        steps["n"] += 1
        return wall_timer(fn, **kw)

    msgs: list[str] = []
    r = bench_problem(prob, device="cpu", timer=timer, compiler=lambda m, mode=None: m, progress=msgs.append,
                      trials=1, workdir=tmp_path, train=True)
    assert steps["n"] == len(MODELS) and r.correct, r.failures
    assert {"grad_allclose", "grad_float64_bound", "allclose"} <= set(r.rules)
    assert any("gradient contract met" in m for m in msgs)
    assert 0 < r.max_abs_err <= 2 * r.ref_max_abs_err + 1e-7 or r.max_abs_err <= 1e-7
    rep = report_json([r], "kfuse bench --train x.py", 30, train=True)
    assert rep["mode"] == "train" and "training step" in rep["method"]


def test_train_step_leaves_gradients_and_fresh_grads_each_call():
    """A training step sets gradients from scratch each call (no accumulation across timed runs)."""
    from kfuse.bench import step_fn, upstream_grads

    model = torch.nn.Linear(5, 3)
    x = [torch.randn(4, 5)]
    ups = upstream_grads(model, x)
    step = step_fn(model, x, ups)
    step()
    g1 = model.weight.grad.clone()
    step()
    torch.testing.assert_close(model.weight.grad, g1)
    torch.testing.assert_close(g1, ups[0].t() @ x[0])
    assert step_fn(model, x, None)().grad_fn is None  # forward mode: no graph


@requires_cuda
@pytest.mark.gpu
def test_bench_train_cli_on_gpu(tmp_path):
    from typer.testing import CliRunner

    from kfuse.cli import app

    name = "39_gemm_scale_batchnorm"
    sets = [a for k, v in SMALL[name].items() for a in ("--set", f"{k}={v}")]
    out = tmp_path / "t.json"
    res = CliRunner().invoke(app, ["bench", "--train", str(SEEDS / f"{name}.py"), "--json", str(out), *sets])
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    assert rep["mode"] == "train" and rep["results"][0]["correct"] is True


@requires_cuda
@pytest.mark.gpu
def test_bench_cli_on_gpu(tmp_path):
    from typer.testing import CliRunner

    from kfuse.cli import app

    name = "12_gemm_multiply_leakyrelu"
    sets = [a for k, v in SMALL[name].items() for a in ("--set", f"{k}={v}")]
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    res = CliRunner().invoke(app, ["bench", str(SEEDS / f"{name}.py"), "--json", str(out), "--plot", str(png), *sets])
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    assert REQUIRED <= set(rep["results"][0]) and rep["results"][0]["correct"] is True
    assert png.exists()


def test_load_kfuse_sets_the_tuner_mode(tmp_path):
    """`kfuse bench --retune` hands the generated module its tuner mode instead of writing the environment."""
    prob = load_problem(SEEDS / "12_gemm_multiply_leakyrelu.py", SMALL["12_gemm_multiply_leakyrelu"])
    assert load_kfuse(prob, "cpu", tmp_path, autotune="force").TUNER.mode == "force"
    module = load_kfuse(prob, "cpu", tmp_path)
    assert module.TUNER.mode == module.SETTINGS.autotune  # None: what KFUSE_AUTOTUNE said when it loaded


def test_unknown_baseline_is_one_line(monkeypatch):
    """An unknown --baselines name: one line naming every model that can be timed, exit 2 (the GPU check comes
    first, so a GPU is pretended here)."""
    from typer.testing import CliRunner

    from kfuse.cli import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    r = CliRunner().invoke(app, ["bench", str(SEEDS / "12_gemm_multiply_leakyrelu.py"), "--baselines", "eager,tf32"])
    want = "kfuse: error: --baselines tf32: expected eager, eager_strict, compile_default or compile_max_autotune"
    assert r.exit_code == 2 and r.output.strip() == want, r.output
