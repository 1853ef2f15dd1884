import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv3d, swish (x * sigmoid(x)), times a per-channel scale of shape (C, 1, 1, 1)."""

    def __init__(self, in_channels, out_channels, kernel_size, scale_shape):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.scale = nn.Parameter(torch.randn(scale_shape))

    def forward(self, x):
        x = self.conv(x)
        x = x * torch.sigmoid(x)
        return x * self.scale


batch_size = 8
in_channels = 3
out_channels = 16
depth, height, width = 16, 32, 32
kernel_size = 3
scale_shape = (out_channels, 1, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, scale_shape]
