"""The conv_channel_reduce kind in the interpreter at odd sizes: a convolution (or transposed one), pointwise ops, one
reduction or softmax over the channels, pointwise ops, against float64 with the contract's bound (2 x eager fp32's
own error). Channels wider than the interpreter's 64-wide column tile and grouped convolutions put a pixel's channels
in several column tiles, so the two-phase merge is what is tested, not a single-tile shortcut."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from kfuse.gradients import gradient_contract
from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module, optimize
from kfuse_testing import ROOT, requires_cuda, write_conv_problem

# (name, __init__ body, forward body, batch, x's shape after the batch)
CASES = [
    # 70 channels: two interpreter column tiles; torch.min(...)[0] with keepdim, per-pixel ops after it
    ("conv2d_wide_min_tanh", "self.conv = nn.Conv2d(5, 70, 3, padding=1)",
     "return torch.tanh(torch.min(self.conv(x) * 2.0, dim=1, keepdim=True)[0])", 3, "5, 9, 7"),
    # stride phases, two groups; softmax then a (C, 1, 1) bias, a scale and sigmoid in the apply pass
    ("conv_transpose2d_grouped_softmax_bias_sigmoid",
     "self.conv = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)\n"
     "self.bias = nn.Parameter(torch.randn(6, 1, 1))",
     "return torch.sigmoid((torch.softmax(self.conv(x), dim=1) + self.bias) * 2.0)", 2, "4, 5, 7"),
    # batch 1 Conv3d, logsumexp with keepdim, per-pixel ops with a one-element parameter (L2 58's ops)
    ("conv3d_batch1_logsumexp_hardswish",
     "self.conv = nn.Conv3d(3, 7, (2, 3, 2))\nself.bias = nn.Parameter(torch.randn(1, 1, 1, 1))",
     "y = torch.logsumexp(self.conv(x), dim=1, keepdim=True)\ny = y * torch.sigmoid(y + 3) / 6\n"
     "return torch.clamp(y - self.bias, min=-1, max=1)", 1, "3, 4, 6, 5"),
    # a full-width op reading both the conv's value and the per-pixel mean; the mean is returned too
    ("conv1d_minus_channel_mean", "self.conv = nn.Conv1d(5, 9, 3, padding=2, dilation=2)",
     "y = torch.relu(self.conv(x))\nm = y.mean(dim=1, keepdim=True)\nreturn y - m, m", 3, "5, 19"),
    # a grouped Conv2d (3 groups of 25 channels, a column tile each), a float64 sum without keepdim; y returned too
    ("conv2d_grouped_sum_two_outputs", "self.conv = nn.Conv2d(6, 75, 3, stride=2, groups=3, bias=False)",
     "y = self.conv(x)\nreturn y, torch.sum(y, dim=1) * 0.5", 2, "6, 11, 8"),
    # log_softmax over dim -3 (the channels of a 4-d value), batch 1, 130 channels: three column tiles
    ("conv2d_batch1_log_softmax", "self.conv = nn.Conv2d(3, 130, 2)",
     "return torch.log_softmax(self.conv(x), dim=-3)", 1, "3, 5, 6"),
    # three stride phases of a transposed Conv1d; amax without keepdim
    ("conv_transpose1d_amax", "self.conv = nn.ConvTranspose1d(4, 66, 3, stride=3, padding=1)",
     "return self.conv(x).amax(dim=1) - 1.0", 2, "4, 7"),
]
CPU = Options(device="cpu", trials=2)


def build(tmp_path: Path, name: str, init: str, forward: str, batch: int, x_shape: str):
    """(problem, compiled, the ModelNew module) of a problem written from the case."""
    prob = load_problem(write_conv_problem(tmp_path, name, init, forward, x_shape, batch))
    compiled = compile_problem(prob, CPU)
    out = tmp_path / f"{name}_new.py"
    out.write_text(compiled.source)
    return prob, compiled, load_module(out)


def outputs(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


@pytest.mark.parametrize("name, init, forward, batch, x_shape", CASES, ids=[c[0] for c in CASES])
def test_against_float64(tmp_path, name, init, forward, batch, x_shape):
    prob, compiled, module = build(tmp_path, name, init, forward, batch, x_shape)
    assert [r.kind for r in compiled.regions] == ["conv_channel_reduce"] and compiled.unfused == []
    torch.manual_seed(0)
    ref = prob.build()
    new = prob.build(cls=module.ModelNew)
    new.load_state_dict(ref.state_dict())
    f64 = copy.deepcopy(ref).double()
    torch.manual_seed(1)
    x = prob.inputs()[0]
    with torch.no_grad():
        got, eager, want = new(x), ref(x), f64(x.double())
    for n, e, r in zip(outputs(got), outputs(eager), outputs(want)):
        assert n.dtype == e.dtype and n.shape == e.shape
        assert err(n, r) <= 2 * err(e, r) + 1e-6, (err(n, r), err(e, r))


REDUCTIONS = {"sum": "torch.sum(y, dim=1)", "mean": "y.mean(dim=1, keepdim=True)", "amax": "torch.amax(y, dim=1)",
              "amin": "torch.min(y, dim=1)[0]", "logsumexp": "torch.logsumexp(y, dim=1, keepdim=True)",
              "softmax": "torch.softmax(y, dim=1)", "log_softmax": "torch.log_softmax(y, dim=1)"}


@pytest.mark.parametrize("channels", [5, 70], ids=["one_tile", "two_tiles"])
@pytest.mark.parametrize("op", REDUCTIONS)
def test_each_reduction_in_one_tile_and_in_two_phases(tmp_path, op, channels):
    """5 channels: the one-tile kernel (the whole region in the convolution's epilogue); 70: the two phases."""
    forward = f"y = torch.relu(self.conv(x))\nreturn {REDUCTIONS[op]} * 1.5"
    prob, compiled, module = build(tmp_path, f"{op}_{channels}", f"self.conv = nn.Conv2d(3, {channels}, 3)", forward,
                                   2, "3, 6, 5")
    assert [r.kind for r in compiled.regions] == ["conv_channel_reduce"] and compiled.unfused == []
    torch.manual_seed(0)
    ref = prob.build()
    new = prob.build(cls=module.ModelNew)
    new.load_state_dict(ref.state_dict())
    x = prob.inputs()[0]
    with torch.no_grad():
        got, eager, want = new(x), ref(x), copy.deepcopy(ref).double()(x.double())
    assert got.shape == eager.shape
    assert err(got, want) <= 2 * err(eager, want) + 1e-6, (err(got, want), err(eager, want))


def test_gradients_through_the_softmax(tmp_path):
    """Training-mode gradients (input and every parameter, rules 2 and 3), the region recomputed in float64."""
    prob, _, module = build(tmp_path, *CASES[1])
    verdict = gradient_contract(prob, module.ModelNew, draws=1)
    assert verdict.correct, verdict.failures


# problems/conv 40-43 through the contract at their own odd sizes: 136 channels (min), a batch-1 Conv3d softmax, a
# grouped Conv2d logsumexp, two Conv3d branches (max without keepdim, a float64 sum with keepdim)
PROBLEMS = {"40_conv2d_wide_scale_channel_min_tanh": 1, "41_conv3d_batch1_softmax_bias_sigmoid": 1,
            "42_conv2d_grouped_logsumexp_hardswish_clamp": 1, "43_conv3d_two_branches_channel_max_sum": 2}


@pytest.mark.parametrize("stem", PROBLEMS)
def test_problem(tmp_path, stem):
    result = optimize(load_problem(ROOT / "problems" / "conv" / f"{stem}.py"), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["conv_channel_reduce"] * PROBLEMS[stem]
    assert result.compiled.unfused == []


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("stem", PROBLEMS)
def test_problem_compiled_on_a_gpu(tmp_path, stem):
    """The compiled kernels (128-wide column tiles: problem 40's 136 channels take two) through the contract."""
    result = optimize(load_problem(ROOT / "problems" / "conv" / f"{stem}.py"), Options(device="cuda", trials=2),
                      workdir=tmp_path)
    assert result.contract.correct, result.contract.failures


def test_transposed_softmax_kernels_compile_for_sm90(tmp_path):
    """Compiled for sm_90 without a GPU (Triton's bundled ptxas): a transposed convolution's one-tile kernel (the
    softmax and the ops after it in the epilogue) and partials kernel (conv_pixels, logsumexp pairs) at the GPU's
    default tile, and the apply pass at its launch tile (128 x 32), lower and fit (the partials and the apply pass
    without spilling). The interpreter
    accepts code the compiler would not; the results are a GPU test's."""
    from kfuse.kernels.conv import ConvConfig
    from test_conv_kernel import compile_sm90

    _, compiled, _ = build(tmp_path, *CASES[1])
    path = tmp_path / "generated.py"
    path.write_text(compiled.source)
    stem = "conv_transpose_softmax_add_mul_sigmoid"
    gpu_tile = ConvConfig(64, 128, 32, 4, 3)
    assert compile_sm90(str(path), f"{stem}_kernel", "fp16x3p", gpu_tile)["spill"] == 0
    # the softmax, bias, scale and sigmoid on top of the tile's 255 registers: 24 bytes spilled (a speed matter)
    assert compile_sm90(str(path), f"{stem}_one_tile_kernel", "fp16x3p", gpu_tile)["spill"] <= 64
    assert compile_sm90(str(path), f"{stem}_apply_kernel", "fp16x3p", ConvConfig(128, 32, 32, 4, 1))["spill"] == 0


def test_launches_tune_their_tile():
    """Both forms' launches go through tuned_conv: the one-tile kernel among tiles as wide as the default (a pixel's
    channels stay in one column tile), the two-phase partials with their (pixels, column tiles) buffers allocated
    per tile (regions/conv_common.tuned_launch), T and cfg rebound for the merge."""
    source = compile_problem(load_problem(ROOT / "problems" / "conv" / "40_conv2d_wide_scale_channel_min_tanh.py",
                                          {"batch_size": 2}), Options(device="cpu")).source
    stem = "conv_mul_amin_view_tanh"
    assert f"{stem}_one_tile_launch, same_columns=True)" in source
    head = source.index(f"def {stem}_launch(cfg):")
    body = source[head:source.index("return pa, pb, T\n", head)]
    assert "T = geo.groups * cdiv(geo.COUT_G, cfg.block_n)" in body and "pa = torch.empty((P, T)" in body
    assert f"pa, pb, T = {stem}_launch(cfg)" in source
