"""Pools after a convolution in capture and partition, device-free: what the `pool` and `mean_dims` ops record, and
when the conv_pool kind takes a convolution's region over (and when it leaves the pool to torch)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kfuse.capture import capture
from kfuse.partition import partition
from kfuse.regions.conv_pool import TRANSPOSED_SWITCH
from kfuse.rewrite import rewrite


class Chain(nn.Module):
    def __init__(self, conv: nn.Module, then, **modules: nn.Module):
        super().__init__()
        self.conv = conv
        self.then = then
        for name, m in modules.items():
            setattr(self, name, m)

    def forward(self, x):
        return self.then(self, self.conv(x))


def regions(model: nn.Module, x: torch.Tensor) -> list[tuple[str, list[str]]]:
    g, _ = rewrite(capture(model, [x]))
    return [(r.kind, r.ops()) for r in partition(g)]


X1, X2, X3 = torch.randn(2, 3, 19), torch.randn(2, 3, 11, 9), torch.randn(1, 3, 5, 7, 6)


def test_pool_modules_and_functions_record_their_geometry():
    m = Chain(nn.Conv2d(3, 4, 3), lambda s, y: (s.mp(y), F.avg_pool2d(y, (2, 3), 1, 1, True, False, 5),
                                                 s.ad(y), y.mean((-1, -2), keepdim=True)),
              mp=nn.MaxPool2d(3, 2, 1, dilation=1), ad=nn.AdaptiveAvgPool2d(1))
    nodes = {n.name: n for n in capture(m, [X2]).nodes}
    assert nodes["mp"].op == "pool" and nodes["mp"].module == "mp"
    assert {k: nodes["mp"].attrs[k] for k in ("mode", "dims", "kernel_size", "stride", "padding")} == {
        "mode": "max", "dims": 2, "kernel_size": 3, "stride": 2, "padding": 1}
    avg = nodes["avg_pool2d"].attrs
    assert (avg["kernel_size"], avg["ceil_mode"], avg["count_include_pad"], avg["divisor_override"]) == (
        (2, 3), True, False, 5)
    assert nodes["ad"].op == "mean_dims" and nodes["ad"].attrs == {"dims": (2, 3), "keepdim": True}
    assert nodes["mean"].op == "mean_dims" and nodes["mean"].attrs == {"dims": (-1, -2), "keepdim": True}


def test_return_indices_and_adaptive_to_two_stay_torch_calls():
    m = Chain(nn.Conv2d(3, 4, 3), lambda s, y: (s.mp(y)[0], s.ad(y)),
              mp=nn.MaxPool2d(2, return_indices=True), ad=nn.AdaptiveAvgPool2d(2))
    ops = {n.name: n.op for n in capture(m, [X2]).nodes}
    assert ops["mp"] == "unknown" and ops["ad"] == "unknown"


def test_maxpool2d_overlapping_joins_with_ops_before_and_after():
    m = Chain(nn.Conv2d(3, 4, 3, padding=1), lambda s, y: torch.tanh(s.pool(torch.relu(y - 0.5)) * 2.0),
              pool=nn.MaxPool2d(3, stride=2, padding=1))
    assert regions(m, X2) == [("conv_pool", ["conv", "sub", "relu", "pool", "mul", "tanh"])]


def test_avgpool3d_and_a_channel_parameter_after_it():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(3, 5, 2)
            self.pool = nn.AvgPool3d(2, ceil_mode=True)
            self.b = nn.Parameter(torch.randn(5, 1, 1, 1))

        def forward(self, x):
            return torch.sigmoid(self.pool(self.conv(x)) + self.b)
    assert regions(M(), X3) == [("conv_pool", ["conv", "pool", "add", "sigmoid"])]


def test_global_means_join_with_the_views_and_ops_after_them():
    m = Chain(nn.Conv2d(3, 4, 3), lambda s, y: F.adaptive_avg_pool2d(F.gelu(y), 1).squeeze(-1).squeeze(-1) * 2.0)
    assert regions(m, X2) == [("conv_pool", ["conv", "gelu", "mean_dims", "view", "view", "mul"])]
    m = Chain(nn.Conv2d(3, 4, 3), lambda s, y: y.mean((2, 3)).reshape(-1))  # (N * C,): not per (sample, channel)
    assert regions(m, X2) == [("conv_pool", ["conv", "mean_dims"]), ("torch", ["view"])]
    m = Chain(nn.Conv1d(3, 4, 3), lambda s, y: torch.relu(y).mean(2) * 3.0)
    assert regions(m, X1) == [("conv_pool", ["conv", "relu", "mean", "mul"])]


def test_mean_over_one_of_two_spatial_dims_is_not_a_pool():
    m = Chain(nn.Conv2d(3, 4, 3), lambda s, y: y.mean((1, 2)))
    assert [k for k, _ in regions(m, X2)] == ["conv_epilogue", "torch"]


def test_value_before_the_pool_read_outside_keeps_the_pool_a_torch_call():
    """The pooled rows never hold the whole conv output, so a pre-pool value read elsewhere cannot be stored."""
    m = Chain(nn.Conv2d(3, 4, 3), lambda s, y: (torch.relu(y), s.pool(torch.relu(y))), pool=nn.MaxPool2d(2))
    kinds = [k for k, _ in regions(m, X2)]
    assert "conv_pool" not in kinds and "torch" in kinds


def test_transposed_conv_pool_joins_unless_switched_off(monkeypatch):
    """A transposed convolution's windowed pool joins its region (two passes); KFUSE_TRANSPOSED_POOLS=0 leaves it
    to torch."""
    m = Chain(nn.ConvTranspose2d(3, 4, 3, stride=2), lambda s, y: s.pool(y), pool=nn.MaxPool2d(2))
    monkeypatch.delenv(TRANSPOSED_SWITCH, raising=False)
    assert regions(m, X2) == [("conv_pool", ["conv_transpose", "pool"])]
    monkeypatch.setenv(TRANSPOSED_SWITCH, "0")
    assert regions(m, X2) == [("conv_epilogue", ["conv_transpose"]), ("torch", ["pool"])]


def test_transposed_conv_global_mean_joins_unless_switched_off(monkeypatch):
    """A global mean of a transposed convolution's pixels joins (the phase tiles' partial sums), the ops after it
    too; KFUSE_TRANSPOSED_POOLS=0 leaves it to torch."""
    m = Chain(nn.ConvTranspose2d(3, 4, 3, stride=2), lambda s, y: torch.relu(y).mean((2, 3), keepdim=True) * 2.0)
    monkeypatch.delenv(TRANSPOSED_SWITCH, raising=False)
    assert regions(m, X2) == [("conv_pool", ["conv_transpose", "relu", "mean_dims", "mul"])]
    monkeypatch.setenv(TRANSPOSED_SWITCH, "0")
    assert regions(m, X2)[0] == ("conv_epilogue", ["conv_transpose", "relu"])


def test_one_d_pool_after_conv1d_and_after_a_gemm():
    m = Chain(nn.Conv1d(3, 4, 3), lambda s, y: s.pool(y), pool=nn.MaxPool1d(2))
    assert regions(m, X1) == [("conv_pool", ["conv", "max_pool1d"])]


def test_windowed_pool_then_global_mean_is_one_region():
    """KernelBench level 2 problem 8's shape: conv, div, MaxPool3d, AdaptiveAvgPool3d(1), + (C, 1, 1, 1) bias."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(3, 5, 2)
            self.pool = nn.MaxPool3d(2)
            self.gap = nn.AdaptiveAvgPool3d((1, 1, 1))
            self.b = nn.Parameter(torch.randn(5, 1, 1, 1))

        def forward(self, x):
            return torch.sum(self.gap(self.pool(self.conv(x) / 2.0)) + self.b, dim=1)
    assert regions(M(), X3)[0] == ("conv_pool", ["conv", "div", "pool", "mean_dims", "add"])


def test_pooled_value_read_outside_keeps_the_mean_out():
    m = Chain(nn.Conv2d(3, 4, 3), lambda s, y: ((p := s.pool(y)), p.mean((2, 3))), pool=nn.MaxPool2d(2))
    assert regions(m, X2)[0] == ("conv_pool", ["conv", "pool"])
