"""A windowed pool after a transposed convolution (regions/conv_pool.py's two passes, on with
KFUSE_TRANSPOSED_POOLS=1): the stride-phase tiles store y, the ops before the pool applied, then a pass over y pools
it and runs the ops after the pool. At odd sizes in the interpreter: 1-d, 2-d and 3-d, groups, max and avg pools
with padding, dilation, ceil_mode, count_include_pad and divisor_override, through the accuracy contract; one through
the gradient contract; off by default (the pool a torch call), and a global mean after the pool left to torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfuse.gradients import gradient_contract
from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module, optimize
from kfuse.regions.conv_pool import TRANSPOSED_SWITCH
from kfuse_testing import long_lines

CPU = Options(device="cpu", trials=2)
TEMPLATE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels={cin}, out_channels={cout}):
        super().__init__()
        self.conv = {conv}
        self.pool = {pool}
        self.bias = nn.Parameter(torch.randn(out_channels, {ones}))

    def forward(self, x):
        {forward}


batch_size = 3


def get_inputs():
    return [torch.randn(batch_size, {x_shape})]


def get_init_inputs():
    return []
'''
# id -> (in, out channels, the conv module, the pool module, spatial dims, x's shape after the batch, forward)
CASES = {
    "2d_max_overlap": (5, 7, "nn.ConvTranspose2d(in_channels, out_channels, 3, stride=2, padding=1, output_padding=1)",
                       "nn.MaxPool2d(3, stride=2, padding=1)", 2, "5, 9, 11",
                       "x = self.pool(torch.relu(self.conv(x)) * 0.5)\n        return torch.relu(x + self.bias) * 2.0"),
    "1d_avg_ceil_nocount_groups": (4, 6, "nn.ConvTranspose1d(in_channels, out_channels, 4, stride=3, groups=2)",
                                   "nn.AvgPool1d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)",
                                   1, "4, 13", "return self.pool(self.conv(x) - 0.25) * 3.0 + self.bias"),
    "3d_max_dilated": (3, 5, "nn.ConvTranspose3d(in_channels, out_channels, 2, stride=2)",
                       "nn.MaxPool3d(2, stride=1, dilation=2)", 3, "3, 4, 5, 3",
                       "return torch.nn.functional.hardswish(self.pool(self.conv(x))) + self.bias"),
    "2d_avg_divisor": (6, 4, "nn.ConvTranspose2d(in_channels, out_channels, (3, 2), stride=(2, 3), padding=(1, 0))",
                       "nn.AvgPool2d(2, padding=1, divisor_override=3)", 2, "6, 7, 5",
                       "return self.pool(self.conv(x)) * self.bias"),
}


def problem(tmp_path: Path, name: str) -> Path:
    cin, cout, conv, pool, dims, x_shape, forward = CASES[name]
    path = tmp_path / f"{name}.py"
    path.write_text(TEMPLATE.format(cin=cin, cout=cout, conv=conv, pool=pool, ones=", ".join(["1"] * dims),
                                    x_shape=x_shape, forward=forward))
    return path


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setenv(TRANSPOSED_SWITCH, "1")


@pytest.mark.parametrize("name", CASES)
def test_the_two_passes_meet_the_contract(on, tmp_path, name):
    result = optimize(load_problem(problem(tmp_path, name)), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["conv_pool"] and result.compiled.unfused == []
    assert "_conv_kernel[" in result.compiled.source and not long_lines(result.compiled.source)


def test_off_by_default_the_pool_stays_a_torch_call(monkeypatch, tmp_path):
    monkeypatch.delenv(TRANSPOSED_SWITCH, raising=False)
    compiled = compile_problem(load_problem(problem(tmp_path, "2d_max_overlap")), CPU)
    assert [r.kind for r in compiled.regions if r.fused] == ["conv_epilogue"]
    assert "nn.MaxPool2d pool" in compiled.unfused


def test_a_global_mean_after_the_pool_stays_a_torch_call(on, tmp_path):
    """The second pass stores pooled values; it has no partial sums for a mean of them (the plain tile's pool does)."""
    path = problem(tmp_path, "2d_max_overlap")
    path.write_text(path.read_text().replace("return torch.relu(x + self.bias) * 2.0",
                                             "return torch.mean(torch.relu(x), dim=(2, 3), keepdim=True) + self.bias"))
    compiled = compile_problem(load_problem(path), CPU)
    assert [r.kind for r in compiled.regions if r.fused] == ["conv_pool"]
    assert any(op.startswith("torch.mean") for op in compiled.unfused), compiled.unfused


def test_the_two_passes_train(on, tmp_path):
    prob = load_problem(problem(tmp_path, "1d_avg_ceil_nocount_groups"))
    compiled = compile_problem(prob, CPU)
    assert [r.kind for r in compiled.regions] == ["conv_pool"]
    out = tmp_path / "new.py"
    out.write_text(compiled.source)
    verdict = gradient_contract(prob, load_module(out).ModelNew, draws=1)
    assert verdict.correct, verdict.failures
