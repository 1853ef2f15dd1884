"""kfuse.memory's rules on made-up byte counts: no GPU needed, the GPU's numbers are only numbers here."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kfuse import memory
from kfuse.memory import DrawBytes, Float64Plan

GB = 10**9
# level1/19_ReLU at full size: 4096 x 393216 floats in and out, nothing else
RELU = DrawBytes(model=0, inputs=6_442_450_944, outputs=6_442_450_944, transient=6_442_450_944)


def test_whole_float64_run_where_it_fits():
    plans = memory.plan_float64(RELU.widened(2), free=78 * GB, batch=4096)
    assert plans[0] == Float64Plan(True, 1)
    assert plans[1] == Float64Plan(True, 2)  # an OOM there: halves next
    assert plans[-1] == Float64Plan(False)  # the CPU last


def test_slices_where_the_whole_batch_does_not_fit():
    need = RELU.widened(2)  # 25.8 GB in float64
    plans = memory.plan_float64(need, free=20 * GB, batch=4096)
    first = plans[0]
    assert first.on_device and first.slices == 2
    rows = 4096 // first.slices
    assert need.model + (need.inputs + need.transient) * rows / 4096 <= memory.SAFETY * 20 * GB
    assert [p.slices for p in plans[:-1]] == sorted(p.slices for p in plans[:-1])
    assert plans[-1] == Float64Plan(False)


def test_cpu_where_rows_cannot_be_sliced_or_the_model_alone_is_too_big():
    assert memory.plan_float64(RELU.widened(2), free=20 * GB, batch=None) == (Float64Plan(False),)
    huge_model = DrawBytes(model=30 * GB, inputs=GB, outputs=GB, transient=GB)
    assert memory.plan_float64(huge_model, free=20 * GB, batch=4096) == (Float64Plan(False),)


def test_on_the_cpu_the_float64_run_is_where_eager_ran():
    assert memory.plan_float64(RELU.widened(2), free=None, batch=4096) == (Float64Plan(True, 1),)


def test_slice_doubling_stops_at_one_row():
    need = DrawBytes(model=0, inputs=10 * GB, outputs=10 * GB, transient=10 * GB)
    plans = memory.plan_float64(need, free=1 * GB, batch=8)  # 2.5 GB a row: not even one fits
    assert plans == (Float64Plan(False),)
    plans = memory.plan_float64(need, free=12 * GB, batch=8)
    assert [p.slices for p in plans if p.on_device][-1] == 8


@pytest.mark.parametrize("batch, slices", [(10, 3), (4096, 7), (5, 5), (3, 8), (1, 1)])
def test_slice_bounds_cover_the_batch(batch, slices):
    bounds = memory.slice_bounds(batch, slices)
    assert bounds[0][0] == 0 and bounds[-1][1] == batch
    assert all(a < b for a, b in bounds) and all(b == a2 for (_, b), (a2, _) in zip(bounds, bounds[1:]))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 and len(bounds) == min(slices, batch)


def test_widened_and_total():
    b = DrawBytes(model=4, inputs=8, outputs=16, transient=12)
    assert b.total == 4 + 8 + 16  # outputs bound the transient from below
    assert b.widened(2) == DrawBytes(8, 16, 32, 24)
    assert memory.float64_factor(torch.float32) == 2 and memory.float64_factor(torch.bfloat16) == 4


def test_keep_results_on_the_device_only_while_small_and_the_next_run_fits():
    assert memory.keep_on_device(GB, free=70 * GB, need_next=13 * GB)
    assert not memory.keep_on_device(19 * GB, free=59 * GB, need_next=13 * GB)  # a large share
    assert not memory.keep_on_device(GB, free=10 * GB, need_next=13 * GB)  # the candidate would not fit
    assert memory.keep_on_device(100 * GB, free=None, need_next=0)  # the CPU: nothing to move


def test_eager_too_big_is_one_line():
    assert memory.eager_too_big("p.py", 10 * GB, 78 * GB) is None
    msg = memory.eager_too_big("p.py", 120 * GB, 78 * GB)
    assert msg == "p.py: the eager model needs ~120.0 GB, the GPU has 78.0 GB free" and "\n" not in msg


def test_slicing_blocked_by_batch_statistics_dropout_and_shapes():
    linear = nn.Linear(4, 3)
    shapes_in, shapes_out = [torch.Size([8, 4])], [torch.Size([8, 3])]
    assert memory.slicing_blocked(linear, shapes_in, shapes_out, 8, False) is None
    assert "batch size" in memory.slicing_blocked(linear, shapes_in, shapes_out, None, False)
    assert "no input" in memory.slicing_blocked(linear, [torch.Size([4, 8])], shapes_out, 8, False)
    assert "output" in memory.slicing_blocked(linear, shapes_in, [torch.Size([])], 8, False)
    assert "buffers" in memory.slicing_blocked(linear, shapes_in, shapes_out, 8, True)
    bn = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    assert "not independent" in memory.slicing_blocked(bn, shapes_in, shapes_out, 8, False)
    assert memory.slicing_blocked(bn.eval(), shapes_in, shapes_out, 8, False) is None  # running statistics
    assert memory.row_mixing_modules(nn.Sequential(nn.Dropout(0.1))) == ["0"]
    assert memory.row_mixing_modules(nn.Sequential(nn.Dropout(0.1)).eval()) == []
    assert memory.row_mixing_modules(nn.LSTM(4, 4)) == ["LSTM"]
    assert memory.row_mixing_modules(nn.BatchNorm2d(3, track_running_stats=False).eval()) == ["BatchNorm2d"]


def test_batch_rows_picks_inputs_led_by_the_batch():
    assert memory.batch_rows([torch.Size([8, 4]), torch.Size([4, 8]), torch.Size([]), torch.Size([8])], 8) == \
        (True, False, False, True)


@pytest.mark.parametrize("make", [
    lambda: torch.arange(1000.0).reshape(10, 100),  # contiguous: flat pieces
    lambda: torch.arange(1000.0).reshape(100, 10).t(),  # not contiguous: rows
    lambda: torch.tensor(3.0),
    lambda: torch.empty(0, 5),
])
def test_paired_chunks_cover_every_element_once(make):
    a = make()
    b = a * 2
    pieces = list(memory.paired_chunks([a, b], elements=64))
    assert sum(p[0].numel() for p in pieces) == a.numel()
    assert all(torch.equal(p[1], p[0] * 2) for p in pieces)
    if a.numel() > 64:
        assert len(pieces) > 1 and all(p[0].numel() <= 100 for p in pieces)


def test_meta_estimate_counts_parameters_inputs_outputs(tmp_path):
    from kfuse.load import load_problem
    from kfuse_testing import write_problem

    prob = load_problem(write_problem(tmp_path, "self.gemm = nn.Linear(in_features, out_features)",
                                      "return self.gemm(x)", batch=37, k=70, n=129))
    est = memory.meta_estimate(prob, torch.float32)
    assert est.model == 4 * (70 * 129 + 129) and est.inputs == 4 * 37 * 70 and est.outputs == 4 * 37 * 129
    assert memory.meta_estimate(prob, torch.bfloat16).inputs == 2 * 37 * 70
