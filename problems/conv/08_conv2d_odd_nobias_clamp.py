import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d without bias at odd sizes and a 3x2 kernel, then clamp to [-1, 1]."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=(2, 1), padding=(1, 0), bias=False)

    def forward(self, x):
        return torch.clamp(self.conv(x), min=-1.0, max=1.0)


batch_size = 13
in_channels = 5
out_channels = 7
height, width = 37, 29
kernel_size = (3, 2)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
