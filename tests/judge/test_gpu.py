"""GPU-only checks of the judge: side streams and timing (skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kfuse.judge import sandbox
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
                   EvalConfig(device="cuda", trials=2, seed=3, perf_trials=30, timeout_s=300, compile_baseline=False,
                              sandboxed=sandbox.unavailable() is None))
    assert not rec.correct and "deferred_work" in rec.flags, rec.flag_details


@pytest.mark.gpu
@gpu
def test_judge_timing_agrees_with_in_process_timing():
    """The judge times the candidate in its worker; the same model timed here with the same function must
    agree within noise (this is what `kfuse bench`, which uses kfuse.timing.time_cuda, measures)."""
    overrides = {"batch_size": 1024, "in_features": 1024, "out_features": 1024}
    rec = evaluate(PROBLEM, HERE / "candidates" / "honest.py",
                   EvalConfig(device="cuda", trials=2, seed=3, perf_trials=100, timeout_s=300, overrides=overrides,
                              sandboxed=sandbox.unavailable() is None))
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
    events = rec.timing["candidate_events"]["median_ms"]
    assert abs(here.median_ms - events) <= 0.15 * here.median_ms + 0.005, (here, rec.timing)
    # the judge's clock (what decides) adds what events never see: the launch and the sync, minus the
    # protocol's own cost
    assert here.median_ms * 0.8 <= rec.runtime_ms <= 1.5 * here.median_ms + 0.05, (here, rec.timing)


SCALE = HERE / "problems" / "scale_relu.py"
BIG_SCALE = {"batch_size": 8192, "features": 8191}  # 268 MB in, 268 MB out: ~0.2 ms on an H100
BIG_LINEAR = {"batch_size": 4096, "in_features": 4096, "out_features": 4097}


def _gpu(trials: int = 2, **kw) -> EvalConfig:
    # where the GPU machine cannot start bubblewrap, these run unsandboxed: they test timing and counting
    return EvalConfig(device="cuda", trials=trials, seed=5, perf_trials=50, timeout_s=400, compile_baseline=False,
                      sandboxed=sandbox.unavailable() is None, **kw)


@pytest.mark.gpu
@gpu
def test_cuda_load_inline_kernel_is_counted():
    rec = evaluate(SCALE, HERE / "candidates" / "honest_cuda_gpu.py", _gpu())
    assert rec.correct and rec.flags == [], (rec.flag_details, rec.error)
    assert rec.kernel_count_source == "profiler" and "scale_relu_cuda_kernel" in " ".join(rec.kernels), rec.kernels


@pytest.mark.gpu
@gpu
def test_triton_counted_and_plain_torch_flagged_by_the_profiler():
    honest = evaluate(PROBLEM, HERE / "candidates" / "honest.py", _gpu())
    assert honest.correct and honest.flags == [] and "linear_relu_kernel" in " ".join(honest.kernels), honest.kernels
    plain = evaluate(PROBLEM, HERE / "candidates" / "no_kernel.py", _gpu())
    assert plain.correct and plain.flags == ["no_custom_kernel"] and plain.library_kernels, plain.to_json()


@pytest.mark.gpu
@gpu
def test_timing_cheats_on_the_gpu():
    phase = evaluate(SCALE, HERE / "candidates" / "timing_phase.py", _gpu(overrides=BIG_SCALE))
    assert not phase.correct and "timed_output_wrong" in phase.flags, phase.flag_details
    memo = evaluate(SCALE, HERE / "candidates" / "timing_input_cache.py", _gpu(overrides=BIG_SCALE))
    assert memo.correct and memo.speedup_eager is not None and memo.speedup_eager < 3, memo.timing
    forged = evaluate(SCALE, HERE / "candidates" / "timing_forged_timer.py", _gpu(overrides=BIG_SCALE))
    assert not forged.correct and "timing_inconsistent" in forged.flags, (forged.flag_details, forged.timing)
    assert forged.speedup_eager is not None and forged.speedup_eager < 3
