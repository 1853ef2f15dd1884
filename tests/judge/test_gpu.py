"""GPU-only checks of the judge: side streams and timing (skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kfuse.judge.evaluate import EvalConfig, evaluate
from kfuse.load import load_problem
from kfuse.timing import time_cuda

HERE = Path(__file__).parent
PROBLEM = HERE / "problems" / "linear_relu.py"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
def test_side_stream_is_caught():
    rec = evaluate(PROBLEM, HERE / "candidates" / "side_stream_gpu.py",
                   EvalConfig(device="cuda", trials=2, seed=3, perf_trials=30, timeout_s=300, compile_baseline=False))
    assert not rec.correct and "deferred_work" in rec.flags, rec.flag_details


@pytest.mark.gpu
@gpu
def test_judge_timing_agrees_with_in_process_timing():
    """The judge times the candidate in its worker; the same model timed here with the same function must
    agree within noise (this is what `kfuse bench`, which uses kfuse.timing.time_cuda, measures)."""
    overrides = {"batch_size": 1024, "in_features": 1024, "out_features": 1024}
    rec = evaluate(PROBLEM, HERE / "candidates" / "honest.py",
                   EvalConfig(device="cuda", trials=2, seed=3, perf_trials=100, timeout_s=300, overrides=overrides))
    assert rec.correct and rec.runtime_ms and rec.ref_runtime_ms and rec.speedup_eager, rec.to_json()

    import importlib.util

    spec = importlib.util.spec_from_file_location("honest_here", HERE / "candidates" / "honest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    problem = load_problem(PROBLEM, overrides)
    model = problem.build(cls=mod.ModelNew).cuda()
    x = problem.inputs()[0].cuda()
    with torch.no_grad():
        here = time_cuda(lambda: model(x), runs=100)
    assert abs(here.median_ms - rec.runtime_ms) <= 0.15 * here.median_ms + 0.005, (here, rec.timing)
