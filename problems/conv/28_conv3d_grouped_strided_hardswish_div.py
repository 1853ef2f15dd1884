import torch
import torch.nn as nn


class Model(nn.Module):
    """Grouped Conv3d (2 groups) with stride 2 and padding 1, then hardswish and a division by a learned
    (C, 1, 1, 1) parameter."""

    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=2, padding=1, groups=groups)
        self.divisor = nn.Parameter(torch.rand(out_channels, 1, 1, 1) + 0.5)

    def forward(self, x):
        return nn.functional.hardswish(self.conv(x)) / self.divisor


batch_size = 2
in_channels = 6
out_channels = 10
groups = 2
depth, height, width = 7, 9, 8
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups]
