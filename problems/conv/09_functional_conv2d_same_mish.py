import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F.conv2d with its own weight and bias parameters and padding='same' (an even kernel: the odd padding
    trailing), then Mish."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size) * 0.1)
        self.bias = nn.Parameter(torch.randn(out_channels) * 0.1)

    def forward(self, x):
        return F.mish(F.conv2d(x, self.weight, self.bias, padding="same"))


batch_size = 16
in_channels = 8
out_channels = 16
height, width = 40, 40
kernel_size = 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
