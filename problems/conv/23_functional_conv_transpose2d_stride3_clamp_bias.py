import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F.conv_transpose2d with parameter weight and bias, stride 3, padding 2, output_padding 1, then clamp and a
    (C, 1, 1) bias added after it."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_channels, out_channels, kernel_size, kernel_size) * 0.1)
        self.bias = nn.Parameter(torch.randn(out_channels) * 0.1)
        self.post_bias = nn.Parameter(torch.randn(out_channels, 1, 1))

    def forward(self, x):
        y = F.conv_transpose2d(x, self.weight, self.bias, stride=3, padding=2, output_padding=1)
        return torch.clamp(y, -0.5, 0.5) + self.post_bias


batch_size = 4
in_channels = 8
out_channels = 6
height, width = 9, 13
kernel_size = 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
