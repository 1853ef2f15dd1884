import torch
import torch.nn as nn


class Model(nn.Module):
    """Grouped Conv2d with stride 2, dilation 2 and padding 2, then tanh."""

    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=2, padding=2, dilation=2, groups=groups)

    def forward(self, x):
        return torch.tanh(self.conv(x))


batch_size = 32
in_channels = 16
out_channels = 32
height, width = 64, 64
kernel_size = 3
groups = 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups]
