import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d, plus a per-channel bias parameter of shape (C, 1, 1), times a scale factor (KernelBench level-2 style)."""

    def __init__(self, in_channels, out_channels, kernel_size, bias_shape, scale_factor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.scale_factor = scale_factor

    def forward(self, x):
        x = self.conv(x)
        x = x + self.bias
        return x * self.scale_factor


batch_size = 32
in_channels = 8
out_channels = 32
height, width = 48, 48
kernel_size = 3
bias_shape = (out_channels, 1, 1)
scale_factor = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape, scale_factor]
