"""Reductions over a convolution's channels, device-free: which ops join a conv_channel_reduce region (capture and
partition), and the two-phase arithmetic of kernels/conv_reduce.py's references against torch at odd widths."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from kfuse.capture import capture
from kfuse.kernels.conv_reduce import channel_merge_ref, channel_partials_ref, channel_reduce_ref
from kfuse.partition import partition
from kfuse.rewrite import rewrite


class Chain(nn.Module):
    """A convolution followed by `then(self, y)`."""

    def __init__(self, conv: nn.Module, then, **params: torch.Tensor):
        super().__init__()
        self.conv = conv
        self.then = then
        self.softmax = nn.Softmax(dim=1)
        for name, t in params.items():
            setattr(self, name, nn.Parameter(t))

    def forward(self, x):
        return self.then(self, self.conv(x))


def regions(model: nn.Module, x: torch.Tensor) -> list[tuple[str, list[str]]]:
    g, _ = rewrite(capture(model, [x]))
    return [(r.kind, r.ops()) for r in partition(g)]


X2 = torch.randn(2, 4, 9, 7)
X3 = torch.randn(2, 4, 5, 6, 7)
CONV2 = nn.Conv2d(4, 6, 3)
KIND = "conv_channel_reduce"


def test_min_values_and_pointwise_ops_after_it_join():
    m = Chain(CONV2, lambda s, y: torch.tanh(torch.min(y * 2.0, dim=1, keepdim=True)[0]))
    assert regions(m, X2) == [(KIND, ["conv", "mul", "amin", "view", "tanh"])]


@pytest.mark.parametrize("then, ops", [
    (lambda s, y: torch.sum(y, dim=1), ["sum"]),
    (lambda s, y: y.mean(1, keepdim=True), ["mean"]),
    (lambda s, y: torch.amax(y, dim=-3), ["amax"]),
    (lambda s, y: torch.logsumexp(y, dim=1, keepdim=True), ["logsumexp"]),
    (lambda s, y: s.softmax(y), ["softmax"]),
    (lambda s, y: torch.log_softmax(y, dim=1), ["log_softmax"]),
], ids=["sum", "mean", "amax_negative_dim", "logsumexp", "nn_softmax", "log_softmax"])
def test_each_channel_reduction_takes_the_region_over(then, ops):
    assert regions(Chain(CONV2, then), X2) == [(KIND, ["conv", *ops])]


def test_softmax_then_channel_bias_scale_and_sigmoid_join():
    m = Chain(nn.ConvTranspose3d(4, 6, 3, stride=2), lambda s, y: torch.sigmoid((torch.softmax(y, dim=1) + s.b) * 2.0),
              b=torch.randn(6, 1, 1, 1))
    assert regions(m, X3) == [(KIND, ["conv_transpose", "softmax", "add", "mul", "sigmoid"])]


def test_full_width_op_reading_the_keepdim_result_joins():
    m = Chain(CONV2, lambda s, y: y - y.amax(dim=1, keepdim=True))
    assert regions(m, X2) == [(KIND, ["conv", "amax", "sub"])]


def test_other_dims_and_a_second_reduction_stay_torch_calls():
    over_height = Chain(CONV2, lambda s, y: torch.sum(y, dim=2))
    assert regions(over_height, X2) == [("conv_epilogue", ["conv"]), ("torch", ["sum"])]
    twice = Chain(CONV2, lambda s, y: torch.min(y, dim=1, keepdim=True)[0].sum(dim=2))
    assert regions(twice, X2) == [(KIND, ["conv", "amin", "view"]), ("torch", ["sum"])]


def test_per_pixel_value_broadcast_back_by_a_channel_parameter_ends_the_region():
    """m (N, 1, H, W) - b (C, 1, 1) is full width again, computed from per-pixel values: not a per-pixel op."""
    m = Chain(CONV2, lambda s, y: torch.logsumexp(y, dim=1, keepdim=True) - s.b, b=torch.randn(6, 1, 1))
    assert regions(m, X2) == [(KIND, ["conv", "logsumexp"]), ("torch", ["sub"])]


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "logsumexp", "softmax", "log_softmax"])
@pytest.mark.parametrize("channels, block_n, groups", [(13, 4, 1), (15, 4, 3), (7, 16, 1)])
def test_partials_then_merge_is_the_channel_reduction(op, channels, block_n, groups):
    torch.manual_seed(0)
    y = torch.randn(3, channels, 5, 4, dtype=torch.float64) * 4
    pa, pb = channel_partials_ref(y, op, block_n, groups)
    assert pa.shape == (3 * 5 * 4, groups * -(-(channels // groups) // block_n))
    merged = channel_merge_ref(pa, pb, op, channels).reshape(3, 5, 4)
    if op in ("softmax", "log_softmax"):  # the merge gives the logsumexp the apply pass subtracts
        lse = merged.unsqueeze(1)
        want = channel_reduce_ref(y, op)
        got = (y - lse).exp() if op == "softmax" else y - lse
    else:
        want, got = channel_reduce_ref(y, op), merged
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
