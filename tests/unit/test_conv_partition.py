"""Convolutions in capture and partition, device-free: what the `conv` op records, and what joins its region."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kfuse.capture import capture
from kfuse.ir import Param
from kfuse.partition import partition
from kfuse.rewrite import rewrite


class Chain(nn.Module):
    """A convolution (module or functional) followed by `then(self, y)`."""

    def __init__(self, conv: nn.Module | None, then, **params: torch.Tensor):
        super().__init__()
        self.conv = conv
        self.then = then
        for name, t in params.items():
            setattr(self, name, nn.Parameter(t))

    def forward(self, x):
        return self.then(self, self.conv(x) if self.conv is not None else x)


def regions(model: nn.Module, x: torch.Tensor) -> list[tuple[str, list[str]]]:
    g, _ = rewrite(capture(model, [x]))
    return [(r.kind, r.ops()) for r in partition(g)]


X2 = torch.randn(2, 4, 9, 7)


def test_module_conv_records_geometry_and_parameters():
    m = Chain(nn.Conv2d(4, 6, (3, 2), stride=2, padding=(1, 0), dilation=(1, 2), groups=2), lambda s, y: y)
    (node,) = capture(m, [X2]).nodes
    assert node.op == "conv" and node.module == "conv"
    assert node.args[1:] == (Param("conv.weight", (6, 2, 3, 2)), Param("conv.bias", (6,)))
    assert node.attrs == {"dims": 2, "stride": (2, 2), "padding": (1, 0), "dilation": (1, 2), "groups": 2}


def test_pointwise_chain_with_channel_parameters_joins():
    m = Chain(nn.Conv2d(4, 6, 3), lambda s, y: torch.relu(y + s.b) * s.scale * 2.0,
              b=torch.randn(6, 1, 1), scale=torch.randn(1, 6, 1, 1))
    assert regions(m, X2) == [("conv_epilogue", ["conv", "add", "relu", "mul", "mul"])]


def test_parameter_along_width_does_not_join():
    """A (W,) parameter broadcasts along the last dim, not the channels: not a column of the tile."""
    m = Chain(nn.Conv2d(4, 6, 3, padding=1), lambda s, y: y + s.b, b=torch.randn(7))
    assert regions(m, X2) == [("conv_epilogue", ["conv"]), ("torch", ["add"])]


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x) + x)  # x: a same-shape value from outside the region (a forward input)


def test_a_forward_input_of_the_output_shape_joins():
    """The residual x is read in the epilogue (tests/test_conv_outside_value.py has the rules)."""
    assert regions(Residual(), X2) == [("conv_epilogue", ["conv", "add", "relu"])]


def test_functional_conv_with_parameter_weight():
    w = torch.randn(5, 4, 4, 4)
    m = Chain(None, lambda s, y: F.silu(F.conv2d(y, s.w, None, 1, "same")), w=w)
    assert regions(m, X2) == [("conv_epilogue", ["conv", "silu"])]
    node = capture(m, [X2]).nodes[0]
    assert node.attrs["padding"] == "same" and node.args[2] is None and node.module is None


def test_conv1d_and_conv3d_are_captured():
    c1 = Chain(nn.Conv1d(3, 5, 4, padding="same", dilation=3), lambda s, y: F.gelu(y))
    assert regions(c1, torch.randn(2, 3, 17)) == [("conv_epilogue", ["conv", "gelu"])]
    c3 = Chain(nn.Conv3d(3, 5, 2, bias=False), lambda s, y: torch.tanh(y))
    assert regions(c3, torch.randn(2, 3, 4, 5, 6)) == [("conv_epilogue", ["conv", "tanh"])]


def test_unsupported_forms_stay_torch_calls():
    """Reflect padding and a weight that is an input are kept as written."""
    reflect = Chain(nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect"), lambda s, y: torch.relu(y))
    assert regions(reflect, X2) == [("torch", ["unknown"]), ("torch", ["relu"])]

    class TwoInputs(nn.Module):
        def forward(self, x, w):
            return F.conv2d(x, w)
    g, _ = rewrite(capture(TwoInputs(), [X2, torch.randn(6, 4, 3, 3)]))
    assert [(r.kind, r.ops()) for r in partition(g)] == [("torch", ["conv"])]


def test_transposed_conv_records_geometry_and_joins_like_a_conv():
    m = Chain(nn.ConvTranspose2d(4, 6, (3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2,
                                 dilation=(1, 2)), lambda s, y: torch.tanh(y * s.scale) - 1.0,
              scale=torch.randn(1, 6, 1, 1))
    node = capture(m, [X2]).nodes[0]
    assert node.op == "conv_transpose" and node.module == "conv"
    assert node.args[1:] == (Param("conv.weight", (4, 3, 3, 2)), Param("conv.bias", (6,)))
    assert node.attrs == {"dims": 2, "stride": (2, 3), "padding": (1, 0), "output_padding": (1, 2),
                          "dilation": (1, 2), "groups": 2}
    assert regions(m, X2) == [("conv_epilogue", ["conv_transpose", "mul", "tanh", "sub"])]
    f3 = Chain(None, lambda s, y: F.relu(F.conv_transpose3d(y, s.w, None, 2, 1, 1)), w=torch.randn(4, 5, 3, 3, 3))
    assert regions(f3, torch.randn(2, 4, 3, 4, 5)) == [("conv_epilogue", ["conv_transpose", "relu"])]
    c1 = Chain(nn.ConvTranspose1d(3, 5, 4, stride=3, dilation=2, bias=False), lambda s, y: y)
    assert regions(c1, torch.randn(2, 3, 17)) == [("conv_epilogue", ["conv_transpose"])]


def test_depthwise_conv_and_its_epilogue_are_one_region():
    """groups == C_in (channel multiplier 1 or more), 1-d to 3-d, bias or not: the conv, its pointwise ops and
    per-channel parameters are one conv_epilogue region (kernels/conv_depthwise.py's direct tile)."""
    m = Chain(nn.Conv2d(4, 4, 3, padding=1, groups=4), lambda s, y: F.hardswish(y) * s.scale,
              scale=torch.randn(4, 1, 1))
    assert regions(m, X2) == [("conv_epilogue", ["conv", "hardswish", "mul"])]
    c1 = Chain(nn.Conv1d(4, 8, 4, padding="same", dilation=3, groups=4, bias=False), lambda s, y: F.silu(y) + y)
    assert regions(c1, torch.randn(2, 4, 19)) == [("conv_epilogue", ["conv", "silu", "add"])]
    c3 = Chain(nn.Conv3d(4, 4, 3, stride=2, groups=4), lambda s, y: torch.relu(y))
    assert regions(c3, torch.randn(2, 4, 5, 6, 7)) == [("conv_epilogue", ["conv", "relu"])]


def test_depthwise_conv_keeps_norms_and_pools_out():
    """The norm, reduction and pool kinds run the GEMM tile: after a depthwise conv the norm or pool stays a torch
    call and the conv's region is a conv_epilogue one."""
    m = Chain(nn.Conv2d(4, 4, 3, groups=4), lambda s, y: s.bn(torch.relu(y)))
    m.bn = nn.BatchNorm2d(4)
    assert regions(m, X2) == [("conv_epilogue", ["conv", "relu"]), ("torch", ["batch_norm"])]
    p = Chain(nn.Conv2d(4, 4, 3, groups=4), lambda s, y: F.max_pool2d(y, 2))
    assert [k for k, _ in regions(p, X2)] == ["conv_epilogue", "torch"]
    r = Chain(nn.Conv2d(4, 4, 3, groups=4), lambda s, y: torch.softmax(y, dim=1))
    assert [k for k, _ in regions(r, X2)][0] == "conv_epilogue"


def test_depthwise_transposed_and_output_size_stay_torch_calls():
    """One input channel a group of a transposed conv (weight (C_in, C_out/groups, ...) with C_in == groups) stays a
    torch call; so does a forward passing output_size (the module call has an extra argument)."""
    depthwise = Chain(nn.ConvTranspose2d(4, 8, 3, stride=2, groups=4), lambda s, y: y)
    assert regions(depthwise, X2) == [("torch", ["conv_transpose"])]

    class OutputSize(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.ConvTranspose2d(4, 6, 3, stride=2)

        def forward(self, x):
            return self.up(x, output_size=[20, 16])
    assert regions(OutputSize(), X2) == [("torch", ["unknown"])]


def test_gemm_regions_are_unchanged_beside_a_conv():
    class ConvThenLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 6, 3)
            self.fc = nn.Linear(5, 8)

        def forward(self, x):
            return torch.relu(self.fc(torch.sigmoid(self.conv(x))))
    assert regions(ConvThenLinear(), X2) == [("conv_epilogue", ["conv", "sigmoid"]),
                                            ("gemm_epilogue", ["linear", "relu"])]


def test_batchnorm_after_the_chain_takes_the_region_over():
    """BatchNorm2d over the conv's channels: the conv_batchnorm kind (the ops before and after the norm join); an op
    after the norm that reads a value from before it cannot run in the apply pass, so it ends the region."""
    m = Chain(nn.Conv2d(4, 6, 3), lambda s, y: torch.relu(s.bn(y * 2.0)) + 1.0)
    m.bn = nn.BatchNorm2d(6)
    assert regions(m, X2) == [("conv_batchnorm", ["conv", "mul", "batch_norm", "relu", "add"])]
    m = Chain(nn.Conv2d(4, 6, 3), lambda s, y: s.bn(y) + y)
    m.bn = nn.BatchNorm2d(6)
    assert regions(m, X2) == [("conv_batchnorm", ["conv", "batch_norm"]), ("torch", ["add"])]


def test_batchnorm3d_after_a_transposed_conv_and_batchnorm1d_after_conv1d():
    m = Chain(nn.ConvTranspose3d(4, 6, 2, stride=2), lambda s, y: s.bn(y))
    m.bn = nn.BatchNorm3d(6)
    assert regions(m, torch.randn(2, 4, 3, 4, 5)) == [("conv_batchnorm", ["conv_transpose", "batch_norm"])]
    m = Chain(nn.Conv1d(4, 6, 3), lambda s, y: s.bn(y))
    m.bn = nn.BatchNorm1d(6)
    assert regions(m, torch.randn(2, 4, 9)) == [("conv_batchnorm", ["conv", "batch_norm"])]
