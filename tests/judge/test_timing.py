"""Timing by the judge's clock (clock.py), exercised on the CPU (`time_on_cpu`): every timed call gets a
fresh input, some timed outputs are checked after the fact, the worker's own timer decides nothing.
CPU times say nothing about speed; what is tested is that the protocol sees through each cheat."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kfuse.judge import sandbox
from kfuse.judge.clock import ClockConfig, batch_size, pick
from kfuse.judge.evaluate import EvalConfig, evaluate

HERE = Path(__file__).parent
PROBLEM = HERE / "problems" / "scale_relu.py"
TIMED = EvalConfig(device="cpu", trials=2, seed=99, timeout_s=180, perf_trials=30, warmup=2, time_on_cpu=True,
                   compile_baseline=False, sandboxed=sandbox.unavailable() is None)
NAMES = ("honest_scale", "timing_input_cache", "timing_phase", "timing_stale", "timing_precompute")


@pytest.fixture(scope="module")
def timed(tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("KFUSE_JUDGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    with ThreadPoolExecutor(max_workers=2) as pool:
        recs = list(pool.map(lambda n: evaluate(PROBLEM, HERE / "candidates" / f"{n}.py", TIMED), NAMES))
    return dict(zip(NAMES, recs))


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_honest_is_timed_with_every_check_passing(timed):
    rec = timed["honest_scale"]
    assert rec.correct and rec.flags == [], rec.flag_details
    assert rec.runtime_ms is not None and rec.ref_runtime_ms is not None and rec.speedup_eager is not None
    assert rec.timing["candidate"]["n"] == 30 and len(rec.timing["protocol"]["checked_calls"]) >= 2
    assert 29 in rec.timing["protocol"]["checked_calls"]  # the last timed call is always checked


def test_fast_only_on_repeated_inputs_is_timed_as_it_is(timed):
    """Fresh inputs every timed call: the memo never hits, so it runs at its real speed."""
    rec = timed["timing_input_cache"]
    assert rec.correct, (rec.flag_details, rec.error)
    assert rec.speedup_eager is not None and rec.speedup_eager < 5, rec.timing


@pytest.mark.parametrize("name", ["timing_phase", "timing_stale"])
def test_wrong_only_while_timed_is_caught(timed, name):
    rec = timed[name]
    assert not rec.correct and "timed_output_wrong" in rec.flags, rec.flag_details
    assert "timed call" in rec.flag_details["timed_output_wrong"]
    assert rec.runtime_ms is None and rec.speedup_eager is None


def test_work_hidden_in_staging_is_flagged(timed):
    """The candidate rewrote the worker's serving loop (its reports are forgeable), but the time it spends
    while inputs are staged is on the judge's clock too."""
    rec = timed["timing_precompute"]
    assert not rec.correct and "timing_inconsistent" in rec.flags, (rec.flag_details, rec.timing)
    assert "staging took" in rec.flag_details["timing_inconsistent"]


def test_baseline_timing_is_cached(timed):
    assert any(r.timing["eager"].get("cached") for r in timed.values())


def test_batches_and_picks():
    cfg = ClockConfig(runs=100, budget_bytes=1000)
    assert batch_size(out_bytes=100, in_bytes=150, cfg=cfg) == 4
    assert batch_size(out_bytes=10**9, in_bytes=0, cfg=cfg) == 1
    chosen = pick(list(range(10, 20)), 3, random.Random(0))
    assert 9 in chosen and len(chosen) in (3, 4) and all(0 <= c < 10 for c in chosen)


def test_events_are_contradicted_by_the_clocks_fast_calls_not_its_noise():
    """Measured on an H100: an honest kfuse candidate whose clock was noisy (median 0.539 ms, 10th percentile
    0.205 ms) against 0.0965 ms of events was flagged by the median; a forged 1 us timer on a 1.6 ms call still is."""
    from kfuse.judge.speed import events_contradicted

    assert events_contradicted(0.539, 0.0965)  # the median: what flagged it before
    assert not events_contradicted(0.205, 0.0965)
    assert not events_contradicted(0.156, 0.035)  # plain torch, two launches: host overhead within the slack
    assert events_contradicted(1.6, 0.001)


def test_gate_keeps_timing_alone():
    """Timing waits for sharers to leave, and sharers wait while a timer waits or runs."""
    import threading
    import time

    from kfuse.judge.clock import Gate

    gate, events = Gate(), []
    entered = threading.Event()

    def sharer(name: str, hold: float) -> None:
        with gate.shared():
            events.append(f"{name} in")
            entered.set()
            time.sleep(hold)
            events.append(f"{name} out")

    def timer() -> None:
        with gate.exclusive():
            events.append("timer in")
            time.sleep(0.05)
            events.append("timer out")

    first = threading.Thread(target=sharer, args=("a", 0.2))
    first.start()
    entered.wait()
    t = threading.Thread(target=timer)
    t.start()
    time.sleep(0.05)
    late = threading.Thread(target=sharer, args=("b", 0.0))
    late.start()
    for th in (first, t, late):
        th.join()
    assert events == ["a in", "a out", "timer in", "timer out", "b in", "b out"]


def test_references_are_cached_by_file_shape_and_seeds(tmp_path, monkeypatch):
    monkeypatch.setenv("KFUSE_JUDGE_CACHE_DIR", str(tmp_path))
    cfg = EvalConfig(device="cpu", trials=2, seed=17, timeout_s=120, sandboxed=False)
    first = evaluate(HERE / "problems" / "linear_relu.py", HERE / "candidates" / "honest.py", cfg).to_json()
    assert len(list(tmp_path.glob("*.pt"))) == 3  # one entry per shape
    second = evaluate(HERE / "problems" / "linear_relu.py", HERE / "candidates" / "honest.py", cfg).to_json()
    drop = ("elapsed_s", "phases_s")
    assert {k: v for k, v in first.items() if k not in drop} == {k: v for k, v in second.items() if k not in drop}
    assert first["correct"]


def test_timed_calls_staged_through_the_evaluations_area(tmp_path, monkeypatch):
    """The area a GPU evaluation allocates ahead (stage_area.py), forced here on the CPU: the candidate and the
    eager baseline are staged through it, batch after batch, and judged as through fresh files."""
    from kfuse.judge import evaluate as evaluate_module
    from kfuse.judge import speed, stage_area

    monkeypatch.setenv("KFUSE_JUDGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(stage_area, "MIN_BYTES", 0)
    monkeypatch.setattr(stage_area, "SHM_FREE_BYTES", 0)
    writes = []
    real_write = stage_area.Area.write

    def counted(self, sets):
        writes.append(self.path)
        return real_write(self, sets)

    def cpu_area(ctx, plan):  # the GPU's area, sized the same, on the CPU (pwrite over pages allocated ahead)
        return speed.sized_area(ctx, plan, gpu=False)

    monkeypatch.setattr(stage_area.Area, "write", counted)
    monkeypatch.setattr(evaluate_module, "stage_area", cpu_area)
    rec = evaluate(PROBLEM, HERE / "candidates" / "honest_scale.py", TIMED)
    assert rec.correct and rec.flags == [], (rec.flag_details, rec.error)
    assert rec.timing["candidate"]["n"] == 30 and rec.timing["eager"]["n"] == 30
    assert len(writes) >= 4 and len(set(writes)) == 1  # warm-up and timed batches, candidate and eager: one area
    assert rec.timing["protocol"]["stage_area"] == "allocated"  # on the CPU: pwrite over pages allocated ahead
    assert not writes[0].exists()  # freed with the evaluation


def test_the_candidate_is_gone_before_its_baselines_are_timed(tmp_path, monkeypatch):
    """Work a candidate leaves running after its own timed calls (a thread looping kernels, a CPU hog) would slow
    the baselines timed after it and inflate its speedup: its worker, and everything it started, is killed first.
    (Before, the worker lived until the evaluation ended: alive while both baselines were timed.)"""
    from kfuse.judge import speed

    monkeypatch.setenv("KFUSE_JUDGE_CACHE_DIR", str(tmp_path))
    seen = []
    real_time_all, real_time_baseline = speed.time_all, speed._time_baseline

    def time_all(worker, *args, **kwargs):
        seen.append(worker)
        return real_time_all(worker, *args, **kwargs)

    def time_baseline(*args, **kwargs):
        seen.append(seen[0].proc.poll())  # None: the candidate's worker still runs
        return real_time_baseline(*args, **kwargs)

    from kfuse.judge import evaluate as evaluate_module
    monkeypatch.setattr(evaluate_module, "time_all", time_all)
    monkeypatch.setattr(speed, "_time_baseline", time_baseline)
    rec = evaluate(PROBLEM, HERE / "candidates" / "honest_scale.py", TIMED)
    assert rec.correct and rec.speedup_eager is not None, (rec.flag_details, rec.error)
    assert len(seen) == 3 and None not in seen[1:], seen  # eager and compile: the candidate had exited both times
