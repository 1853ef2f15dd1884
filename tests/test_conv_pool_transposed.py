"""A windowed pool after a transposed convolution (regions/conv_pool.py's two passes, on unless
KFUSE_TRANSPOSED_POOLS=0): the stride-phase tiles store y, the ops before the pool applied, then a pass over y pools
it and runs the ops after the pool. At odd sizes in the interpreter: 1-d, 2-d and 3-d, groups, max and avg pools
with padding, dilation, ceil_mode, count_include_pad and divisor_override, through the accuracy contract; one through
the gradient contract; switched off, the pool a torch call; and a global mean after the pool left to torch. A global
mean of the transposed convolution's pixels (AdaptiveAvgPool to one, a mean over every spatial dim): 1-d, 2-d and 3-d,
groups, dilation, uneven strides, samples smaller than a row tile, phases with no tap; in training too."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, optimize
from kfuse.regions.conv_pool import TRANSPOSED_SWITCH
from kfuse_testing import gradient_verdict, long_lines, write_conv_problem

CPU = Options(device="cpu", trials=2)
# id -> (the Model's __init__ body, its forward, x's shape after the batch)
CASES = {
    "2d_max_overlap": ("self.conv = nn.ConvTranspose2d(5, 7, 3, stride=2, padding=1, output_padding=1)\n"
                       "self.pool = nn.MaxPool2d(3, stride=2, padding=1)\n"
                       "self.bias = nn.Parameter(torch.randn(7, 1, 1))",
                       "x = self.pool(torch.relu(self.conv(x)) * 0.5)\nreturn torch.relu(x + self.bias) * 2.0",
                       "5, 9, 11"),
    "1d_avg_ceil_nocount_groups": ("self.conv = nn.ConvTranspose1d(4, 6, 4, stride=3, groups=2)\n"
                                   "self.pool = nn.AvgPool1d(3, stride=2, padding=1, ceil_mode=True, "
                                   "count_include_pad=False)\nself.bias = nn.Parameter(torch.randn(6, 1))",
                                   "return self.pool(self.conv(x) - 0.25) * 3.0 + self.bias", "4, 13"),
    "3d_max_dilated": ("self.conv = nn.ConvTranspose3d(3, 5, 2, stride=2)\n"
                       "self.pool = nn.MaxPool3d(2, stride=1, dilation=2)\n"
                       "self.bias = nn.Parameter(torch.randn(5, 1, 1, 1))",
                       "return torch.nn.functional.hardswish(self.pool(self.conv(x))) + self.bias", "3, 4, 5, 3"),
    "2d_avg_divisor": ("self.conv = nn.ConvTranspose2d(6, 4, (3, 2), stride=(2, 3), padding=(1, 0))\n"
                       "self.pool = nn.AvgPool2d(2, padding=1, divisor_override=3)\n"
                       "self.bias = nn.Parameter(torch.randn(4, 1, 1))",
                       "return self.pool(self.conv(x)) * self.bias", "6, 7, 5"),
}


# a global mean after a transposed convolution: phase tiles' sums per (sample, phase, row tile), then the finalize
MEANS = {
    "2d_mean_keepdim": ("self.conv = nn.ConvTranspose2d(5, 7, 3, stride=2, padding=1, output_padding=1)\n"
                        "self.bias = nn.Parameter(torch.randn(7, 1, 1))",
                        "x = torch.mean(torch.relu(self.conv(x)) * 0.5, dim=(2, 3), keepdim=True)\n"
                        "return torch.relu(x + self.bias) * 3.0", "5, 9, 11"),
    "1d_mean_groups_dilated": ("self.conv = nn.ConvTranspose1d(4, 6, 3, stride=3, dilation=2, groups=2)\n"
                               "self.scale = nn.Parameter(torch.randn(6))",
                               "return self.conv(x).mean(2) * self.scale", "4, 13"),
    "3d_adaptive_uneven_strides": ("self.conv = nn.ConvTranspose3d(3, 5, (2, 3, 2), stride=(2, 1, 3))\n"
                                   "self.gap = nn.AdaptiveAvgPool3d(1)",
                                   "return self.gap(torch.sigmoid(self.conv(x)))", "3, 3, 4, 2"),
    # 2 x 2 output pixels a sample: a row tile holds many samples; stride 3 > kernel 1: phases without a tap
    "2d_tiny_samples_tapless_phases": ("self.conv = nn.ConvTranspose2d(3, 4, 1, stride=3, padding=1)",
                                       "return self.conv(x).mean((2, 3)) - 1.0", "3, 2, 2"),
}


def problem(tmp_path: Path, name: str) -> Path:
    return write_conv_problem(tmp_path, name, *{**CASES, **MEANS}[name])


@pytest.fixture
def on(monkeypatch):  # the default, set so that a KFUSE_TRANSPOSED_POOLS=0 in the environment does not skip them
    monkeypatch.setenv(TRANSPOSED_SWITCH, "1")


@pytest.mark.parametrize("name", CASES)
def test_the_two_passes_meet_the_contract(on, tmp_path, name):
    result = optimize(load_problem(problem(tmp_path, name)), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["conv_pool"] and result.compiled.unfused == []
    assert "_conv_kernel[" in result.compiled.source and not long_lines(result.compiled.source)
    assert "_conv_launch)" in result.compiled.source  # pass 1's tile tuned (tuned_launch) as the epilogue's


@pytest.mark.parametrize("name", MEANS)
def test_a_global_mean_meets_the_contract(on, tmp_path, name):
    result = optimize(load_problem(problem(tmp_path, name)), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["conv_pool"] and result.compiled.unfused == []
    source = result.compiled.source
    assert "store_segment_sums(" in source and "_finalize_kernel[" in source and not long_lines(source)
    assert "_partial_launch)" in source  # the phase tiles tuned with their partials


def test_switched_off_the_pool_stays_a_torch_call(monkeypatch, tmp_path):
    monkeypatch.setenv(TRANSPOSED_SWITCH, "0")
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


def test_a_global_mean_trains(on, tmp_path):
    prob = load_problem(problem(tmp_path, "2d_mean_keepdim"))
    compiled = compile_problem(prob, CPU)
    assert [r.kind for r in compiled.regions] == ["conv_pool"]
    verdict = gradient_verdict(prob, compiled, tmp_path)
    assert verdict.correct, verdict.failures


def test_the_two_passes_train(on, tmp_path):
    prob = load_problem(problem(tmp_path, "1d_avg_ceil_nocount_groups"))
    compiled = compile_problem(prob, CPU)
    assert [r.kind for r in compiled.regions] == ["conv_pool"]
    verdict = gradient_verdict(prob, compiled, tmp_path)
    assert verdict.correct, verdict.failures
