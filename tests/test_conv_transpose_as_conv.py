"""A ConvTranspose at stride 1 without output padding runs on the convolution tile as the convolution it is
(kernels/conv_transpose.py transposed_as_conv, regions/conv_common.as_convolution): the weight identity against
torch in float64 at odd geometries, the cached weight, which geometries take it, and whole problems of every kind
through the contract in the interpreter, with the switch off too (the phase tile)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kfuse.ir import Node, Param
from kfuse.kernels.conv_transpose import transposed_as_conv
from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module, optimize
from kfuse.regions.conv_common import AS_CONV_SWITCH, CONV_TRANSPOSE, TRANSPOSED_AS_CONV, form_of
from kfuse_testing import gradient_verdict, write_conv_problem

TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
CONVOLVE = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
# (x shape, weight shape (C_in, C_out/groups, k...), padding, groups, dilation): padding 0 up to dilation * (k - 1)
IDENTITY = [
    ((2, 5, 9), (5, 3, 4), 0, 1, 3),
    ((1, 6, 5, 7), (6, 2, 3, 2), (2, 1), 3, 1),
    ((2, 4, 3, 4, 5), (4, 3, 2, 3, 3), (1, 2, 0), 2, (1, 1, 2)),
]


@pytest.mark.parametrize("xs, ws, padding, groups, dilation", IDENTITY)
def test_the_convolution_it_is(xs, ws, padding, groups, dilation):
    torch.manual_seed(0)
    x, w = torch.randn(*xs, dtype=torch.float64), torch.randn(*ws, dtype=torch.float64)
    b = torch.randn(ws[1] * groups, dtype=torch.float64)
    dims = len(xs) - 2
    ref = TRANSPOSE[dims](x, w, b, 1, padding, 0, groups, dilation)
    w2, stride, pad, dil, g = transposed_as_conv(w, 1, padding, 0, groups, dilation)
    torch.testing.assert_close(CONVOLVE[dims](x, w2, b, stride, pad, dil, g), ref, rtol=1e-12, atol=1e-12)


def test_the_weight_is_made_once_per_version():
    conv = torch.nn.ConvTranspose2d(4, 6, 3, groups=2)
    first = transposed_as_conv(conv.weight, 1, 0, 0, 2, 1)[0]
    assert transposed_as_conv(conv.weight, 1, 0, 0, 2, 1)[0] is first and not first.requires_grad
    with torch.no_grad():
        conv.weight.mul_(2.0)  # an optimizer step's in-place write: a new version
    again = transposed_as_conv(conv.weight, 1, 0, 0, 2, 1)[0]
    assert again is not first and torch.equal(again, first * 2.0)


@pytest.mark.parametrize("stride, padding, output_padding", [(2, 0, 0), (1, 3, 0), ((1, 2), 0, 0)])
def test_other_geometry_is_refused(stride, padding, output_padding):
    w = torch.randn(3, 4, 3, 3)
    with pytest.raises(ValueError, match="regenerate"):
        transposed_as_conv(w, stride, padding, output_padding, 1, 1)


def _anchor(stride, padding, output_padding, dilation) -> Node:
    attrs = {"dims": 2, "stride": stride, "padding": padding, "output_padding": output_padding, "dilation": dilation,
             "groups": 1}
    return Node("ct", "conv_transpose", ("x", Param("ct.weight", (3, 4, 3, 3)), None), (2, 4, 9, 9), attrs)


@pytest.mark.parametrize("geometry, form", [
    (((1, 1), (0, 0), (0, 0), (1, 1)), TRANSPOSED_AS_CONV),
    (((1, 1), (2, 2), (0, 0), (1, 1)), TRANSPOSED_AS_CONV),  # padding d * (k - 1): the convolution's padding 0
    (((1, 1), (3, 0), (0, 0), (1, 1)), CONV_TRANSPOSE),  # more: a negative convolution padding
    (((1, 1), (3, 0), (0, 0), (2, 1)), TRANSPOSED_AS_CONV),  # ... unless dilated
    (((1, 1), (0, 0), (1, 0), (2, 1)), CONV_TRANSPOSE),  # output padding (allowed at stride 1 with dilation)
    (((2, 1), (0, 0), (0, 0), (1, 1)), CONV_TRANSPOSE),
])
def test_which_transposed_convolutions_take_the_convolution_tile(monkeypatch, geometry, form):
    monkeypatch.delenv(AS_CONV_SWITCH, raising=False)
    assert form_of(_anchor(*geometry)) is form
    monkeypatch.setenv(AS_CONV_SWITCH, "0")
    assert form_of(_anchor(*geometry)) is CONV_TRANSPOSE


CPU = Options(device="cpu", trials=2)
# one region of each kind after a stride-1 ConvTranspose (KernelBench level 2 19, 10, 42, 61, 77, 11 have them)
PROBLEMS = {
    "epilogue_3d_dilated": ("self.conv = nn.ConvTranspose3d(3, 5, 3, padding=(1, 0, 2), dilation=(1, 1, 2))",
                            "return torch.relu(self.conv(x)) * 2.0", "3, 4, 5, 3"),
    "gelu_groupnorm": ("self.conv = nn.ConvTranspose2d(4, 6, 3)\nself.gn = nn.GroupNorm(2, 6)",
                       "return self.gn(F.gelu(self.conv(x)))", "4, 7, 5"),
    "maxpool_mean_tanh": ("self.conv = nn.ConvTranspose2d(3, 4, 3, padding=1, groups=1)\n"
                          "self.pool = nn.MaxPool2d(2)",
                          "return torch.tanh(self.pool(self.conv(x)).mean((2, 3), keepdim=True))", "3, 9, 7"),
    "batchnorm_global_mean": ("self.conv = nn.ConvTranspose3d(4, 6, 2, groups=2)\nself.bn = nn.BatchNorm3d(6)",
                              "return self.bn(self.conv(x) * 0.5).mean((2, 3, 4))", "4, 3, 4, 3"),
    "channel_logsumexp_1d": ("self.conv = nn.ConvTranspose1d(5, 7, 4, padding=2)",
                             "return torch.logsumexp(self.conv(x), dim=1)", "5, 11"),
}


@pytest.mark.parametrize("switch", ["1", "0"])
@pytest.mark.parametrize("name", PROBLEMS)
def test_problems_through_the_contract(tmp_path, monkeypatch, name, switch):
    monkeypatch.setenv(AS_CONV_SWITCH, switch)
    result = optimize(load_problem(write_conv_problem(tmp_path, name, *PROBLEMS[name], batch=2)), CPU,
                      workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert any(r.fused for r in result.compiled.regions)
    source = result.compiled.source
    if switch == "1":
        assert "= transposed_as_conv(weight," in source and "= conv_transpose_plan(x," not in source
    else:
        assert "= transposed_as_conv(" not in source


def test_gradients_and_a_changed_geometry(tmp_path):
    """Autograd recomputes the module's own ConvTranspose; a module whose stride changed after the file was written
    is refused with a clear error, not computed as the wrong convolution."""
    prob = load_problem(write_conv_problem(tmp_path, "gn", *PROBLEMS["gelu_groupnorm"], batch=2))
    compiled = compile_problem(prob, CPU)
    verdict = gradient_verdict(prob, compiled, tmp_path)
    assert verdict.correct, verdict.failures
    out = tmp_path / "gn_changed.py"
    out.write_text(compiled.source)
    model = prob.build(cls=load_module(out).ModelNew)
    model.conv.stride = (2, 2)
    with pytest.raises(ValueError, match="regenerate"):
        model(*prob.inputs())
