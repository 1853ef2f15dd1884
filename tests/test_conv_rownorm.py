"""The conv_rownorm kind in the interpreter at odd sizes. A convolution (or transposed one) with a LayerNorm over
trailing dims of its output (W alone, H x W, C x L, whole rows of more than one chunk), with and without the affine,
module and functional forms, through the accuracy contract; one through the gradient contract; the row moments
against their torch reference; and what stays a torch call (a LayerNorm over other dims, after a depthwise
convolution). A windowed pool after a LayerNorm, GroupNorm or InstanceNorm (regions/pool_pass.py): its apply pass in
the pool's rows, through both contracts, and a value between the norm and the pool read elsewhere keeping it out.
Softmax and log_softmax over rows (a view flattening trailing dims, then viewed back, as KernelBench level 2 problem
38; W itself; whole samples over two chunks), their statistics against torch, and softmaxes that are not rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kfuse.kernels.conv_norm import conv_ln_moments, conv_ln_moments_ref, conv_softmax_stats, conv_softmax_stats_ref
from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module, optimize
from kfuse_testing import gradient_verdict, long_lines, write_conv_problem

CPU = Options(device="cpu", trials=2)
# id -> (the Model's __init__ body, its forward, x's shape after the batch)
CASES = {
    # KernelBench level 2 problem 34's ops: a transposed conv, LayerNorm over its last dim (W), GELU, a scale
    "transposed3d_last_dim_gelu": ("self.conv = nn.ConvTranspose3d(3, 5, 4, stride=2, padding=1)\n"
                                   "self.norm = nn.LayerNorm(10)",
                                   "return torch.nn.functional.gelu(self.norm(self.conv(x))) * 2.0", "3, 4, 6, 5"),
    # over (H, W) with its affine, a per-channel bias after it; a grouped, strided conv
    "grouped2d_hw_affine_bias": ("self.conv = nn.Conv2d(4, 6, 3, stride=(2, 1), groups=2)\n"
                                 "self.norm = nn.LayerNorm((5, 9))\nself.bias = nn.Parameter(torch.randn(6, 1, 1))",
                                 "return torch.relu(self.norm(self.conv(x) - 0.5) + self.bias)", "4, 11, 11"),
    # over (C, L) (a whole sample), no affine; the conv's own value is a second output (stored by pass 1)
    "conv1d_whole_sample_two_outputs": ("self.conv = nn.Conv1d(5, 7, 3, padding=2, dilation=2)\n"
                                        "self.norm = nn.LayerNorm((7, 19), elementwise_affine=False)",
                                        "y = self.conv(x)\nreturn y, torch.tanh(self.norm(y))", "5, 19"),
    # F.layer_norm with a weight parameter and eps as a number; rows of 3 x 19 x 23 = 1311 elements: two chunks
    "functional_rows_of_two_chunks": ("self.conv = nn.Conv3d(2, 4, 3, padding=1)\n"
                                      "self.w = nn.Parameter(torch.randn(3, 19, 23))",
                                      "y = torch.sigmoid(self.conv(x))\n"
                                      "return F.layer_norm(y, (3, 19, 23), self.w, None, 1e-3) + y", "2, 3, 19, 23"),
}


def problem(tmp_path: Path, name: str) -> Path:
    return write_conv_problem(tmp_path, name, *CASES[name], batch=2)


@pytest.mark.parametrize("name", CASES)
def test_meets_the_contract(tmp_path, name):
    result = optimize(load_problem(problem(tmp_path, name)), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["conv_rownorm"] and result.compiled.unfused == []
    source = result.compiled.source
    assert "conv_ln_moments(" in source and "_apply_kernel[" in source and not long_lines(source)
    assert "tuned_conv(" in source  # pass 1's tile tuned on a GPU


def test_a_width_other_than_normalized_shape_fails_as_in_torch(tmp_path):
    prob = load_problem(problem(tmp_path, "transposed3d_last_dim_gelu"))
    compiled = compile_problem(prob, CPU)
    path = tmp_path / "new.py"
    path.write_text(compiled.source)
    model = load_module(path).ModelNew()
    x = torch.randn(2, 3, 4, 6, 6)  # W 12 after the convolution, not the norm's 10
    with pytest.raises(RuntimeError, match="normalized_shape"):
        model(x)


def test_trains(tmp_path):
    prob = load_problem(problem(tmp_path, "grouped2d_hw_affine_bias"))
    compiled = compile_problem(prob, CPU)
    assert [r.kind for r in compiled.regions] == ["conv_rownorm"]
    verdict = gradient_verdict(prob, compiled, tmp_path)
    assert verdict.correct, verdict.failures


# segments: None, row_plan's (one in the interpreter); 3: rows of 1024 or more split over programs (2-3 segments
# of the interpreter's 1024-wide chunks, the last one short), their float64 partials merged on the host
@pytest.mark.parametrize("segments", [None, 3])
@pytest.mark.parametrize("rows, length", [(37, 70), (5, 1311), (1, 1), (129, 64), (3, 2500)])
def test_row_moments_match_torch(rows, length, segments):
    torch.manual_seed(rows)
    y = torch.randn(rows * length) * 3.0 + 1.5
    mean, rstd = conv_ln_moments(y, length, 1e-5, segments)
    ref_mean, ref_var = conv_ln_moments_ref(y.double(), length)
    assert torch.allclose(mean.double(), ref_mean, atol=1e-6)
    assert torch.allclose(rstd.double(), (ref_var + 1e-5).rsqrt(), rtol=1e-5)


@pytest.mark.parametrize("init, forward", [
    # over H alone (not the trailing dims)
    ("self.conv = nn.Conv2d(3, 4, 3)", "return F.layer_norm(self.conv(x).transpose(2, 3), (7,))"),
    # after a depthwise convolution (its direct tile)
    ("self.conv = nn.Conv2d(3, 3, 3, groups=3)\nself.norm = nn.LayerNorm(7)", "return self.norm(self.conv(x))"),
])
def test_stays_a_torch_call(tmp_path, init, forward):
    prob = load_problem(write_conv_problem(tmp_path, "other", init, forward, "3, 9, 9", batch=2))
    compiled = compile_problem(prob, CPU)
    assert "conv_rownorm" not in [r.kind for r in compiled.regions]
    assert any("layer_norm" in op or "LayerNorm" in op for op in compiled.unfused), compiled.unfused


# a windowed pool after the norm (pool_pass.py): the apply pass runs in the pool's rows, so the norm's output is never
# stored; GroupNorm's kind takes it the same way
POOLED = {
    # KernelBench level 2 problem 3's ops: a transposed conv, + a 0-d parameter, LayerNorm over W, AvgPool3d, GELU
    "transposed3d_layernorm_avgpool_gelu": ("self.conv = nn.ConvTranspose3d(3, 4, 3, stride=2, padding=1, "
                                            "output_padding=1)\nself.w = nn.Parameter(torch.tensor(1.0))\n"
                                            "self.norm = nn.LayerNorm(8)\nself.pool = nn.AvgPool3d(2)",
                                            "return F.gelu(self.pool(self.norm(self.conv(x) + self.w)))", "3, 3, 4, 4"),
    # KernelBench level 2 problem 85's ops: GroupNorm, a per-channel scale, an overlapping padded MaxPool2d, a clamp
    "conv2d_groupnorm_scale_maxpool_clamp": ("self.conv = nn.Conv2d(3, 8, 3)\nself.gn = nn.GroupNorm(4, 8)\n"
                                             "self.scale = nn.Parameter(torch.randn(8, 1, 1))\n"
                                             "self.pool = nn.MaxPool2d(3, stride=2, padding=1)",
                                             "return torch.clamp(self.pool(self.gn(self.conv(x)) * self.scale), "
                                             "-0.5, 0.5)", "3, 11, 9"),
    # InstanceNorm after a transposed conv, then a ceil-mode avg pool without padding counted, a residual of y
    "transposed2d_instancenorm_residual_avgpool": ("self.conv = nn.ConvTranspose2d(4, 6, 3, stride=2)\n"
                                                  "self.norm = nn.InstanceNorm2d(6, affine=True)\n"
                                                  "self.pool = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, "
                                                  "count_include_pad=False)",
                                                  "y = self.conv(x)\nreturn self.pool(self.norm(y) + y) * 2.0",
                                                  "4, 5, 6"),
}


@pytest.mark.parametrize("name", POOLED)
def test_a_pool_after_the_norm_meets_the_contract(tmp_path, name):
    path = write_conv_problem(tmp_path, name, *POOLED[name], batch=2)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    kinds = [r.kind for r in result.compiled.regions if r.fused]
    assert len(kinds) == 1 and kinds[0] in ("conv_rownorm", "conv_groupnorm"), kinds
    unfused = result.compiled.unfused
    assert not any("pool" in op.lower() for op in unfused), unfused
    assert "window_pixel(" in result.compiled.source and not long_lines(result.compiled.source)


def test_a_pool_after_the_norm_trains(tmp_path):
    prob = load_problem(write_conv_problem(tmp_path, "gn_pool", *POOLED["conv2d_groupnorm_scale_maxpool_clamp"],
                                           batch=2))
    compiled = compile_problem(prob, CPU)
    verdict = gradient_verdict(prob, compiled, tmp_path)
    assert verdict.correct, verdict.failures


def test_a_value_between_the_norm_and_the_pool_read_outside_keeps_the_pool_out(tmp_path):
    """The pooled pass never holds the norm's output whole, so a second use of it leaves the pool to torch."""
    init = "self.conv = nn.Conv2d(3, 4, 3)\nself.norm = nn.LayerNorm(7)\nself.pool = nn.MaxPool2d(2)"
    forward = "z = torch.relu(self.norm(self.conv(x)))\nreturn z, self.pool(z)"
    compiled = compile_problem(load_problem(write_conv_problem(tmp_path, "two", init, forward, "3, 9, 9", batch=2)),
                               CPU)
    assert [r.kind for r in compiled.regions if r.fused] == ["conv_rownorm"]
    assert "nn.MaxPool2d pool" in compiled.unfused


# softmax / log_softmax over rows of trailing elements
SOFTMAX = {
    # KernelBench level 2 problem 38's ops after its pool: clamp, a softmax over each channel's pixels, a scale
    "transposed3d_clamp_spatial_softmax_scale": ("self.conv = nn.ConvTranspose3d(3, 5, 3, stride=2, padding=1, "
                                                 "output_padding=1)\n"
                                                 "self.scale = nn.Parameter(torch.randn(1, 5, 1, 1, 1))",
                                                 "x = torch.clamp(self.conv(x), 0.0, 1.0)\nb, c, d, h, w = x.shape\n"
                                                 "x = torch.softmax(x.view(b, c, -1), dim=2)\n"
                                                 "return x.view(b, c, d, h, w) * self.scale", "3, 3, 4, 5"),
    "conv2d_log_softmax_over_w": ("self.conv = nn.Conv2d(4, 6, 3, padding=1)",
                                  "return F.log_softmax(self.conv(x), dim=-1) + 1.0", "4, 7, 9"),
    # a whole sample a row: 7 x 13 x 17 = 1547 elements, two chunks in the interpreter
    "conv2d_sample_softmax_two_chunks": ("self.conv = nn.Conv2d(3, 7, 3, padding=1)",
                                         "y = torch.relu(self.conv(x))\nn = y.shape[0]\n"
                                         "return torch.softmax(y.reshape(n, -1), 1).reshape(y.shape) * 100.0",
                                         "3, 13, 17"),
}


@pytest.mark.parametrize("name", SOFTMAX)
def test_a_softmax_over_rows_meets_the_contract(tmp_path, name):
    path = write_conv_problem(tmp_path, name, *SOFTMAX[name], batch=2)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions if r.fused] == ["conv_rownorm"], result.compiled.regions
    assert result.compiled.unfused == [] and "conv_softmax_stats(" in result.compiled.source


def test_a_softmax_over_rows_trains(tmp_path):
    prob = load_problem(write_conv_problem(tmp_path, "sm", *SOFTMAX["transposed3d_clamp_spatial_softmax_scale"],
                                           batch=2))
    compiled = compile_problem(prob, CPU)
    verdict = gradient_verdict(prob, compiled, tmp_path)
    assert verdict.correct, verdict.failures


@pytest.mark.parametrize("segments", [None, 3])
@pytest.mark.parametrize("rows, length", [(37, 70), (3, 2500), (1, 1), (2, 1311)])
def test_softmax_stats_match_torch(rows, length, segments):
    torch.manual_seed(rows)
    y = torch.randn(rows * length) * 4.0
    if rows == 2:  # a segment of -inf (its partial sum 0, its max -inf) and a later segment with the row's max
        y[:1024] = float("-inf")
        y[length + 1200] = 30.0
    top, total = conv_softmax_stats(y, length, segments)
    ref_top, ref_total = conv_softmax_stats_ref(y.double(), length)
    assert torch.equal(top.double(), ref_top)
    assert torch.allclose(total.double(), ref_total, rtol=1e-6)


@pytest.mark.parametrize("forward", [
    # the flattened view read twice: its rows cannot stay the kernels' identity
    "y = self.conv(x)\nv = y.view(y.shape[0], y.shape[1], -1)\nreturn torch.softmax(v, 2), v",
    # a softmax over channels of the flattened view (not its last dim): conv_channel_reduce's or torch's
    "y = self.conv(x)\nreturn torch.softmax(y.view(y.shape[0], y.shape[1], -1), 1).view(y.shape)",
])
def test_other_softmaxes_are_not_rows(tmp_path, forward):
    prob = load_problem(write_conv_problem(tmp_path, "other_sm", "self.conv = nn.Conv2d(3, 4, 3)", forward, "3, 9, 9",
                                           batch=2))
    compiled = compile_problem(prob, CPU)
    assert "conv_rownorm" not in [r.kind for r in compiled.regions]
