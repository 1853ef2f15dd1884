import torch
import torch.nn as nn


class Model(nn.Module):
    """Grouped Conv2d (8 channels a group in and out) without bias, SiLU, minus a per-channel parameter."""

    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1, groups=groups, bias=False)
        self.shift = nn.Parameter(torch.randn(1, out_channels, 1, 1) * 0.1)

    def forward(self, x):
        return torch.nn.functional.silu(self.conv(x)) - self.shift


batch_size = 5
in_channels = 32
out_channels = 32
groups = 4
height, width = 23, 21
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups]
