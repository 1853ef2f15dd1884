"""The conv_batchnorm kind in the interpreter at odd sizes: a convolution (or transposed one) with BatchNorm after it,
in training mode (batch statistics, running statistics updated as torch does, over several calls) and eval mode
(the norm folded into W' and b', or normalized with the running statistics in the epilogue), against float64 with
the contract's bound (2 x eager fp32's own error), and the fold's cache following in-place changes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from kfuse.gradients import gradient_contract
from kfuse.kernels.conv_norm import conv_bn_fold, conv_bn_stats_ref
from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module
from kfuse_testing import ROOT, tuned_stats_launch, write_conv_problem

# (name, __init__ body, forward body, x's shape after the batch, whether eval folds the norm into the weights)
CASES = [
    ("conv2d_bn_relu",
     "self.conv = nn.Conv2d(5, 7, 3, stride=(1, 2), padding=1)\nself.bn = nn.BatchNorm2d(7)",
     "return torch.relu(self.bn(self.conv(x)))", "5, 9, 11", True),
    # stride phases of different sizes: the partials' counts differ per tile; cumulative average (momentum None)
    ("conv_transpose2d_bn_tanh",
     "self.conv = nn.ConvTranspose2d(5, 7, 3, stride=2, padding=1, output_padding=1)\n"
     "self.bn = nn.BatchNorm2d(7, momentum=None)",
     "return torch.tanh(self.bn(self.conv(x)) * 2.0)", "5, 9, 11", True),
    # an op before the norm: eval normalizes in the epilogue; grouped, no conv bias, no affine
    ("conv3d_scale_bn_noaffine",
     "self.conv = nn.Conv3d(4, 6, (2, 3, 2), groups=2, bias=False)\nself.bn = nn.BatchNorm3d(6, affine=False)\n"
     "self.s = nn.Parameter(torch.randn(1, 6, 1, 1, 1))",
     "return self.bn(self.conv(x) * self.s) + 0.5", "4, 5, 7, 6", False),
    # the conv's own value read outside the region: stored by the stats kernel too
    ("conv1d_bn_two_outputs",
     "self.conv = nn.Conv1d(5, 7, 3, padding=2, dilation=2)\nself.bn = nn.BatchNorm1d(7)",
     "y = self.conv(x)\nreturn y, torch.sigmoid(self.bn(y))", "5, 19", False),
    # a windowed pool after the norm (KernelBench level 2 72's and 11's): the apply pass in the pool's rows, in both
    # modes (eval with the running statistics, never folded: the pool's pass reads y)
    ("conv_transpose3d_bn_avgpool",
     "self.conv = nn.ConvTranspose3d(3, 5, 3, stride=2, padding=1)\nself.bn = nn.BatchNorm3d(5)\n"
     "self.pool = nn.AvgPool3d(2)",
     "return self.pool(self.bn(self.conv(x))) * 2.0", "3, 3, 4, 5", False),
    ("conv2d_bn_tanh_maxpool_padded",
     "self.conv = nn.Conv2d(4, 6, 3)\nself.bn = nn.BatchNorm2d(6)\nself.pool = nn.MaxPool2d(3, stride=2, padding=1)",
     "return torch.relu(self.pool(torch.tanh(self.bn(self.conv(x)))) - 0.25)", "4, 11, 10", False),
]
CPU = Options(device="cpu", trials=2)


def build(tmp_path: Path, name: str, init: str, forward: str, x_shape: str):
    """(problem, the regions' kinds, the ModelNew module) of a problem written from the case."""
    prob = load_problem(write_conv_problem(tmp_path, name, init, forward, x_shape))
    compiled = compile_problem(prob, CPU)
    out = tmp_path / f"{name}_new.py"
    out.write_text(compiled.source)
    return prob, compiled, load_module(out)


def pair(prob, module):
    torch.manual_seed(0)
    ref = prob.build()
    new = prob.build(cls=module.ModelNew)
    new.load_state_dict(ref.state_dict())
    return ref, new


def outputs(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def assert_within_contract(new_outs, eager_outs, f64_outs):
    """Rule 3 (2 x eager fp32's error against float64 + a small floor) for each output."""
    for n, e, r in zip(outputs(new_outs), outputs(eager_outs), outputs(f64_outs)):
        assert n.dtype == e.dtype and n.shape == e.shape
        assert err(n, r) <= 2 * err(e, r) + 1e-6, (err(n, r), err(e, r))


def buffers(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in m.named_buffers()}


@pytest.mark.parametrize("name, init, forward, x_shape, folds", CASES, ids=[c[0] for c in CASES])
def test_train_then_eval_against_float64(tmp_path, name, init, forward, x_shape, folds):
    prob, compiled, module = build(tmp_path, name, init, forward, x_shape)
    assert [r.kind for r in compiled.regions] == ["conv_batchnorm"] and compiled.unfused == []
    ref, new = pair(prob, module)
    f64 = copy.deepcopy(ref).double()
    for draw in range(2):  # training: batch statistics, running statistics over two calls
        torch.manual_seed(10 + draw)
        x = prob.inputs()[0]
        with torch.no_grad():
            assert_within_contract(new(x), ref(x), f64(x.double()))
    for (k, b_ref), b_new, b_64 in zip(buffers(ref).items(), buffers(new).values(), buffers(f64).values()):
        if b_ref.is_floating_point():
            assert err(b_new, b_64) <= 2 * err(b_ref, b_64) + 1e-7, (k, err(b_new, b_64), err(b_ref, b_64))
        else:
            assert torch.equal(b_new, b_ref), k  # num_batches_tracked
    for m in (ref, new, f64):
        m.eval()
    x = prob.inputs()[0]
    with torch.no_grad():
        assert_within_contract(new(x), ref(x), f64(x.double()))
    assert ("bn-eval-fold" in compiled.rewrites) == folds


def test_eval_fold_cache_follows_running_stats_and_weight(tmp_path):
    name, init, forward, x_shape, _ = CASES[0]
    prob, _, module = build(tmp_path, name, init, forward, x_shape)
    ref, new = pair(prob, module)
    ref.eval()
    new.eval()
    x = prob.inputs()[0]
    with torch.no_grad():
        new(x)
        first = new.conv.weight._kfuse_conv_bn_fold
        new(x)
        assert new.conv.weight._kfuse_conv_bn_fold is first  # reused
        for m in (ref, new):  # in-place writes: new versions, a new fold
            m.bn.running_mean.add_(0.25)
            m.bn.running_var.mul_(1.5)
            m.conv.weight.mul_(0.5)
        f64 = copy.deepcopy(ref).double()
        assert_within_contract(new(x), ref(x), f64(x.double()))
        assert new.conv.weight._kfuse_conv_bn_fold is not first


def test_gradients_through_the_norm(tmp_path):
    """Training-mode gradients (input and every parameter, rules 2 and 3), the region recomputed in float64."""
    name, init, forward, x_shape, _ = CASES[1]
    prob, _, module = build(tmp_path, name, init, forward, x_shape)
    verdict = gradient_contract(prob, module.ModelNew, draws=1)
    assert verdict.correct, verdict.failures


@pytest.mark.parametrize("transposed, groups", [(False, 1), (False, 3), (True, 1), (True, 3)])
def test_fold_matches_batch_norm_in_float64(transposed, groups):
    """conv(x, W') + b' == BatchNorm(conv(x, W) + b) with running statistics, grouped and transposed weights."""
    torch.manual_seed(0)
    c_in, c_out = 6, 9
    conv = (torch.nn.ConvTranspose2d(c_in, c_out, 3, groups=groups) if transposed
            else torch.nn.Conv2d(c_in, c_out, 3, groups=groups)).double()
    bn = torch.nn.BatchNorm2d(c_out).double().eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(-2, 2)
        bn.bias.uniform_(-1, 1)
    x = torch.randn(2, c_in, 7, 8, dtype=torch.float64)
    w, b = conv_bn_fold(conv.weight, conv.bias, bn, transposed, groups)
    fn = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
    with torch.no_grad():
        got = fn(x, w, b, groups=groups)
        want = bn(conv(x))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_stats_reference_is_per_channel():
    y = torch.randn(3, 4, 5, 6, dtype=torch.float64)
    mean, var = conv_bn_stats_ref(y)
    flat = y.transpose(0, 1).reshape(4, -1)
    torch.testing.assert_close(mean, flat.mean(1))
    torch.testing.assert_close(var, flat.var(1, unbiased=False))


def test_stats_launch_tunes_with_its_own_partials():
    """As conv_groupnorm's: the training statistics' per-tile partials are allocated inside the tuned launch, as many
    as the config's row tiles (conv_row_tiles: of wide rows for the Hopper twin, which this plain convolution's
    kernels have); the eval launch (folded into the weights) is tuned too, its output allocated inside."""
    body = tuned_stats_launch("18_conv2d_batchnorm_relu.py", "conv_batch_norm_relu_stats")
    assert "tiles = conv_row_tiles(geo, cfg)" in body and "mean_part = torch.empty((tiles, geo.C_out)" in body
    source = compile_problem(load_problem(ROOT / "problems" / "conv" / "18_conv2d_batchnorm_relu.py",
                                          {"batch_size": 2}), Options(device="cpu")).source
    folded = source[source.index("def conv_batch_norm_relu_folded_launch(cfg):"):]
    assert folded.index("buf_relu = torch.empty(") < folded.index("return buf_relu")
    assert "buf_relu = conv_batch_norm_relu_folded_launch(cfg)" in source
