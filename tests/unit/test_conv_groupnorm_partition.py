"""GroupNorm and InstanceNorm after a convolution, device-free: what capture records (nn.InstanceNorm2d/3d and
F.instance_norm besides nn.GroupNorm / F.group_norm), what the conv_groupnorm kind takes, and the bounds of its
partials' layout (kernels/conv_norm.conv_gn_layout) against a brute-force count."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kfuse.capture import capture
from kfuse.kernels.conv_geometry import conv_geometry
from kfuse.kernels.conv_norm import conv_gn_layout
from kfuse.kernels.conv_transpose import conv_transpose_geometry
from kfuse.partition import partition
from kfuse.rewrite import rewrite


class Chain(nn.Module):
    """A convolution, then `then(self, y)`; extra modules as keyword arguments."""

    def __init__(self, conv: nn.Module, then, **mods: nn.Module):
        super().__init__()
        self.conv = conv
        self.then = then
        for name, m in mods.items():
            setattr(self, name, m)

    def forward(self, x):
        return self.then(self, self.conv(x))


def regions(model: nn.Module, x: torch.Tensor) -> list[tuple[str, list[str]]]:
    g, _ = rewrite(capture(model, [x]))
    return [(r.kind, r.ops()) for r in partition(g)]


X2 = torch.randn(2, 4, 9, 7)


def test_groupnorm_takes_the_conv_region_over_with_ops_on_both_sides():
    m = Chain(nn.Conv2d(4, 6, 3), lambda s, y: torch.tanh(s.gn(y * 2.0)) + 1.0, gn=nn.GroupNorm(3, 6))
    assert regions(m, X2) == [("conv_groupnorm", ["conv", "mul", "group_norm", "tanh", "add"])]


def test_residual_of_the_norms_input_joins_and_other_pre_values_do_not():
    m = Chain(nn.Conv2d(4, 6, 3), lambda s, y: y + s.gn(y), gn=nn.GroupNorm(2, 6))
    assert regions(m, X2) == [("conv_groupnorm", ["conv", "group_norm", "add"])]
    m = Chain(nn.Conv2d(4, 6, 3), lambda s, y: y + s.gn(torch.relu(y)), gn=nn.GroupNorm(2, 6))
    assert regions(m, X2) == [("conv_groupnorm", ["conv", "relu", "group_norm"]), ("torch", ["add"])]


@pytest.mark.parametrize("norm, x", [
    (nn.InstanceNorm1d(6, affine=True), torch.randn(2, 4, 11)),
    (nn.InstanceNorm2d(6), X2),
    (nn.InstanceNorm3d(6, affine=True), torch.randn(2, 4, 3, 5, 4)),
])
def test_instance_norms_are_captured_and_fused(norm, x):
    conv = {3: nn.Conv1d, 4: nn.Conv2d, 5: nn.ConvTranspose3d}[x.dim()](4, 6, 3)
    m = Chain(conv, lambda s, y: s.norm(y) / 2.0, norm=norm)
    assert [n.op for n in capture(m, [x]).nodes][1] == "instance_norm"
    assert regions(m, x) == [("conv_groupnorm", [conv_op(x, conv), "instance_norm", "div"])]


def conv_op(x: torch.Tensor, conv: nn.Module) -> str:
    return "conv_transpose" if isinstance(conv, nn.ConvTranspose3d) else "conv"


def test_functional_norms_are_captured():
    m = Chain(nn.Conv2d(4, 6, 3), lambda s, y: F.instance_norm(y, eps=1e-3))
    assert regions(m, X2) == [("conv_groupnorm", ["conv", "instance_norm"])]
    m = Chain(nn.Conv2d(4, 6, 3), lambda s, y: F.group_norm(y, 2))
    assert regions(m, X2) == [("conv_groupnorm", ["conv", "group_norm"])]


def test_running_statistics_and_unbatched_inputs_stay_torch_calls():
    """An InstanceNorm tracking running statistics, F.instance_norm with running ones, and InstanceNorm2d on a
    3-d (unbatched) input, which normalizes per leading index over the rest, are torch calls."""
    m = Chain(nn.Conv2d(4, 6, 3), lambda s, y: s.norm(y), norm=nn.InstanceNorm2d(6, track_running_stats=True))
    assert regions(m, X2) == [("conv_epilogue", ["conv"]), ("torch", ["unknown"])]
    rm, rv = torch.zeros(6), torch.ones(6)
    m = Chain(nn.Conv2d(4, 6, 3), lambda s, y: F.instance_norm(y, rm, rv))
    assert regions(m, X2)[0] == ("conv_epilogue", ["conv"])
    m = Chain(nn.Conv1d(4, 6, 3), lambda s, y: s.norm(y), norm=nn.InstanceNorm2d(6))
    assert regions(m, torch.randn(2, 4, 11)) == [("conv_epilogue", ["conv"]), ("torch", ["unknown"])]


def test_one_norm_a_region():
    """BatchNorm then GroupNorm: the first norm's kind takes the region, the second norm is not joined."""
    m = Chain(nn.Conv2d(4, 6, 3), lambda s, y: s.gn(s.bn(y)), bn=nn.BatchNorm2d(6), gn=nn.GroupNorm(3, 6))
    assert regions(m, X2)[0] == ("conv_batchnorm", ["conv", "batch_norm"])


def samples_and_tiles(rows_per_sample: list[int], n: int, block_m: int) -> tuple[int, int]:
    """Brute force over each phase's rows n * S + s: the most samples one block_m tile touches and the most tiles
    one sample touches."""
    most_samples = most_tiles = 0
    for s in rows_per_sample:
        if s == 0:
            continue
        tiles = {}
        for r in range(n * s):
            tiles.setdefault(r // block_m, set()).add(r // s)
        most_samples = max(most_samples, max(len(v) for v in tiles.values()))
        most_tiles = max(most_tiles, max(sum(smp in v for v in tiles.values()) for smp in range(n)))
    return most_samples, most_tiles


@pytest.mark.parametrize("n, hw, block_m", [(3, (5, 7), 16), (1, (9, 11), 16), (5, (3, 2), 64), (4, (11, 13), 32),
                                            (2, (1, 1), 16)])
def test_layout_bounds_cover_every_tile_and_sample(n, hw, block_m):
    geo = conv_geometry((n, 2, *hw), (3, 2, 1, 1), 1, 0, 1, 1)
    phases, j, slots = conv_gn_layout(geo, block_m)
    most_samples, most_tiles = samples_and_tiles([hw[0] * hw[1]], n, block_m)
    assert phases == 1 and slots >= most_samples and j >= most_tiles


@pytest.mark.parametrize("n, size, stride, block_m", [(3, (3, 5), (2, 2), 16), (2, (2, 7), (3, 2), 16),
                                                      (4, (1, 4), (3, 1), 32)])
def test_layout_bounds_for_stride_phases(n, size, stride, block_m):
    """A transposed convolution's phases have different pixels a sample: J from the largest, slots the smallest."""
    geo = conv_transpose_geometry((n, 2, *size), (2, 3, 3, 3), stride, 1, 0, 1, 1)
    phases, j, slots = conv_gn_layout(geo, block_m)
    oh, ow = geo.OH, geo.OW
    sizes = [len(range(rh, oh, stride[0])) * len(range(rw, ow, stride[1]))
             for rh in range(stride[0]) for rw in range(stride[1])]
    most_samples, most_tiles = samples_and_tiles(sizes, n, block_m)
    assert phases == stride[0] * stride[1] and slots >= most_samples and j >= most_tiles
