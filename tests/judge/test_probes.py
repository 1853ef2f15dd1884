"""Device-free unit tests of the judge's pieces: timing records, probes, detectors, fast_p, shape plans."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kfuse import timing
from kfuse.judge import cheats
from kfuse.judge.evaluate import EvalRecord
from kfuse.judge.shapes import derive, extra_problems, plan_shapes
from kfuse.judge.suite import FAST_P, fast_p
from kfuse.load import load_problem

PROBLEMS = Path(__file__).parent / "problems"


def test_timing_summary_and_unavailable():
    t = timing.summarize([float(i) for i in range(1, 101)])
    assert t.median_ms == 50.5 and t.min_ms == 1 and t.max_ms == 100 and t.n == 100
    assert 10 <= t.p10_ms <= 11 and 90 <= t.p90_ms <= 91
    off = timing.timing_unavailable("no GPU")
    assert not off.available and math.isnan(off.median_ms)
    assert off.to_json()["median_ms"] is None and off.to_json()["reason"] == "no GPU"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")
def test_time_cuda_without_gpu_is_unavailable():
    assert not timing.time_cuda(lambda: None).available


def test_timing_sees_a_replaced_event_class():
    real = torch.cuda.Event
    try:
        torch.cuda.Event = type("Fake", (), {})
        assert timing.replaced() == ["torch.cuda.Event"]
    finally:
        torch.cuda.Event = real
    assert timing.replaced() == []


def test_baseline_detects_and_restores():
    base = cheats.Baseline.capture()
    real = torch.allclose
    torch.allclose = lambda *a, **k: True
    try:
        assert base.replaced() == ["torch.allclose"]
        base.restore(base.replaced())
        assert torch.allclose is real and base.replaced() == []
    finally:
        torch.allclose = real


def test_precision_flags_changed_and_restored():
    before = cheats.precision_flags()
    torch.set_float32_matmul_precision("medium")
    try:
        after = cheats.precision_flags()
        lines = cheats.changed_flags(before, after)
        assert any("'medium'" in line for line in lines)
        cheats.restore_precision(before, [k for k in before if after[k] != before[k]])
        assert cheats.precision_flags() == before
    finally:
        torch.set_float32_matmul_precision(before["torch.get_float32_matmul_precision()"])


def test_output_problems():
    class Sub(torch.Tensor):
        pass

    x = torch.ones(3)
    assert cheats.output_problems([x]) == []
    assert "not torch.Tensor" in cheats.output_problems([x.as_subclass(Sub)])[0]
    assert "meta" in cheats.output_problems([torch.empty(3, device="meta")])[0]


def test_aliases_and_overlaps():
    x = torch.zeros(4, 4)
    assert cheats.aliases([x[1:]], [x]) == ["output 0 shares memory with input 0"]
    assert cheats.aliases([x.clone()], [x]) == []


def test_bitwise_equal_treats_nan_as_data():
    a = torch.tensor([1.0, float("nan")])
    assert cheats.bitwise_equal(a, a.clone()) and not cheats.bitwise_equal(a, torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_poison_marks_empty_and_is_counted(dtype):
    with cheats.PoisonEmpty():
        out = torch.empty(4, 5, dtype=dtype)
        like = torch.empty_like(out)
    assert torch.isnan(out.float()).all() and torch.isnan(like.float()).all()
    out[:3] = 1.0  # the last row is "never written"
    normal = torch.ones(4, 5, dtype=dtype)
    assert cheats.unwritten_count(out, normal, normal) == 5


def test_every_detector_fires_on_its_evidence_and_not_on_clean():
    assert cheats.detect(cheats.Evidence(calls=3, custom_launches=3)) == {}
    fields = {"monkeypatch": "replaced", "precision_flags": "precision", "global_mode": "modes",
              "lazy_output": "output_types", "output_aliases_input": "aliases", "inputs_modified": "inputs_modified",
              "cached_results": "repeated", "unwritten_output": "unwritten", "deferred_work": "late_changes",
              "process_introspection": "introspection", "shape_specialized": "specialized",
              "timing_inconsistent": "timing", "timed_output_wrong": "timed_wrong", "background_thread": "threads"}
    for name, attr in fields.items():
        ev = cheats.Evidence(calls=3, custom_launches=3)
        getattr(ev, attr).append("seen")
        assert list(cheats.detect(ev)) == [name]
    assert list(cheats.detect(cheats.Evidence(calls=3))) == ["no_custom_kernel"]
    assert "no_custom_kernel" not in cheats.FAILING and "background_thread" not in cheats.FAILING


def test_reference_that_aliases_or_modifies_allows_the_same():
    ev = cheats.Evidence(calls=1, custom_launches=1, aliases=["output 0 shares memory with input 0"],
                         inputs_modified=["input 0 changed"], ref_aliases_input=True, ref_modifies_inputs=True)
    assert cheats.detect(ev) == {}


def _rec(correct, speedup):
    return EvalRecord("p", "r", "c", "cuda", "fp32", 0, compiled=True, correct=correct, speedup_eager=speedup)


def test_fast_p():
    fp = fast_p([_rec(True, 2.5), _rec(True, 0.9), _rec(False, 5.0), _rec(True, 1.2)])
    assert list(fp) == [f"fast_{p:g}" for p in FAST_P]
    assert fp["fast_0"] == 0.75 and fp["fast_1"] == 0.5 and fp["fast_2"] == 0.25 and fp["fast_3"] == 0
    cpu = fast_p([_rec(True, None), _rec(False, None)])
    assert cpu["fast_0"] == 0.5 and cpu["fast_0.5"] is None


def test_shape_plan_draws_odd_sizes_per_run():
    prob = load_problem(PROBLEMS / "linear_relu.py")
    labels = set()
    for seed in range(40):
        extra = extra_problems(prob, seed)
        assert len(extra) == 2
        (batch, b_label), (feat, f_label) = extra
        labels.add(b_label)
        for p in (batch, feat):
            for name, v in p.constants().items():
                if v != prob.constants()[name]:
                    assert v % 2 == 1 and 5 <= v - prob.constants()[name] <= 64, (name, v)
    assert len(labels) > 10  # drawn per run, not a fixed offset
    shapes = plan_shapes(prob, seed=10, trials=3, extra=True)
    assert [s.label for s in shapes][0] == "" and len(shapes) == 3
    seeds = [s for sh in shapes for s in sh.input_seeds]
    assert len(seeds) == len(set(seeds)) == 5
    # the worker sees model seeds only; input seeds are unrelated numbers
    assert not {sh.model_seed for sh in shapes} & set(seeds)
    assert derive(10, "input", 0, 0) != derive(11, "input", 0, 0)
