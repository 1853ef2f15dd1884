"""A value computed outside a convolution's region, of its output's shape, read by the epilogue (regions/conv_common
outside_value; KernelArgs.operand loads it at the tile's output offsets): KernelBench level 2 problem 26's second
input added after a ConvTranspose3d. In the interpreter: the accuracy and gradient contracts (the second input's
gradient too, the backward's recompute reads it); device-free: which values qualify (forward inputs and values
computed before the convolution, of exactly its shape), that the kinds taking a walk over leave such a walk to
conv_epilogue, and that the CUDA backend leaves the op to torch. And a detached copy of the convolution's own value
(level 2 problem 20): a view in the epilogue, the gradient stopped there by the backward's recompute."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kfuse.capture import capture
from kfuse.cuda.regions import KINDS as CUDA_KINDS
from kfuse.load import load_problem
from kfuse.optimize import Options, optimize
from kfuse.partition import partition
from kfuse.rewrite import rewrite
from kfuse_testing import ROOT, gradient_verdict, long_lines

PROBLEM = ROOT / "problems" / "conv" / "48_conv_transpose3d_add_second_input_hardswish.py"
DETACHED = ROOT / "problems" / "conv" / "49_conv2d_detached_copy_residuals.py"
CPU = Options(device="cpu", trials=2)


class TwoInputs(nn.Module):
    def __init__(self, then, norm: nn.Module | None = None):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = norm
        self.then = then

    def forward(self, x, other):
        return self.then(self, self.conv(x), other)


class Forward(TwoInputs):
    """forward(x, other) = fn(self, x, other): the order of the ops is fn's."""

    def __init__(self, fn):
        super().__init__(None)
        self.fn = fn

    def forward(self, x, other):
        return self.fn(self, x, other)


def regions(model: nn.Module, *inputs: torch.Tensor, kinds=None) -> list[tuple[str, list[str]]]:
    g, _ = rewrite(capture(model, list(inputs)))
    return [(r.kind, r.ops()) for r in (partition(g) if kinds is None else partition(g, kinds))]


X, SAME, ROW = torch.randn(2, 3, 9, 7), torch.randn(2, 4, 9, 7), torch.randn(1, 4, 9, 7)


def fused_whole(path, tmp_path):
    """optimize's result for the problem file: both contracts met, one conv_epilogue region, nothing left to torch."""
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["conv_epilogue"] and result.compiled.unfused == []
    assert not long_lines(result.compiled.source)
    verdict = gradient_verdict(load_problem(path), result.compiled, tmp_path)
    assert verdict.correct, verdict.failures
    return result.compiled.source


def test_the_problem_meets_both_contracts_with_its_second_input_in_the_kernel(tmp_path):
    source = fused_whole(PROBLEM, tmp_path)
    assert "v_add_input = tl.load(v_add_input_ptr + out_offs, mask=mask" in source


def test_a_detached_copy_is_a_view_in_the_epilogue_and_stops_the_gradient(tmp_path):
    source = fused_whole(DETACHED, tmp_path)
    assert "detach = clone.detach()" in source  # the backward's recompute, as eager's graph
    assert regions(Forward(lambda s, x, o: (lambda y: y * y.detach())(s.conv(x))), X, SAME, kinds=CUDA_KINDS) == [
        ("conv_epilogue", ["conv"]), ("torch", ["view"]), ("torch", ["mul"])]


def test_which_outside_values_join():
    """A forward input or a value computed before the convolution, of its output's shape: in the region. A value
    computed after it (its call could not read it) or one that broadcasts: a torch call."""
    product = TwoInputs(lambda s, y, o: torch.relu(y * o))
    assert regions(product, X, SAME) == [("conv_epilogue", ["conv", "mul", "relu"])]

    before = Forward(lambda s, x, o: (lambda t: s.conv(x) - t)(torch.tanh(o)))  # tanh(o) traced before the conv
    assert regions(before, X, SAME) == [("torch", ["tanh"]), ("conv_epilogue", ["conv", "sub"])]
    after = Forward(lambda s, x, o: (lambda y: y + torch.tanh(o))(s.conv(x)))
    assert regions(after, X, SAME) == [("conv_epilogue", ["conv"]), ("torch", ["tanh"]), ("torch", ["add"])]
    assert regions(TwoInputs(lambda s, y, o: y + o), X, ROW) == [("conv_epilogue", ["conv"]), ("torch", ["add"])]


def test_a_norm_after_an_outside_value_stays_a_torch_call():
    """The norm, pool and channel kinds do not take over a walk that reads an outside value (their kernels do not
    load one): the epilogue keeps the add, the norm is a torch call."""
    model = TwoInputs(lambda s, y, o: s.norm(y + o), nn.GroupNorm(2, 4))
    assert regions(model, X, SAME) == [("conv_epilogue", ["conv", "add"]), ("torch", ["group_norm"])]
    pooled = TwoInputs(lambda s, y, o: F.max_pool2d(y + o, 2))
    assert regions(pooled, X, SAME)[0] == ("conv_epilogue", ["conv", "add"])


def test_the_cuda_backend_leaves_the_outside_value_to_torch():
    assert regions(TwoInputs(lambda s, y, o: torch.relu(y + o)), X, SAME, kinds=CUDA_KINDS) == [
        ("conv_epilogue", ["conv"]), ("torch", ["add"]), ("torch", ["relu"])]
