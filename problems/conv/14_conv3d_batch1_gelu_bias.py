import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv3d on a batch of one with an asymmetric kernel and stride, GELU, then a (C, 1, 1, 1) bias."""

    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=(1, 2, 2), padding=(1, 0, 1))
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.1)

    def forward(self, x):
        return torch.nn.functional.gelu(self.conv(x)) + self.bias


batch_size = 1
in_channels = 4
out_channels = 12
depth, height, width = 9, 17, 15
kernel_size = (3, 2, 3)
bias_shape = (out_channels, 1, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
