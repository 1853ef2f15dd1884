import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv2d, subtract two numbers, Mish (KernelBench level 2 problem 87's ops)."""

    def __init__(self, in_channels, out_channels, kernel_size, subtract_value_1, subtract_value_2):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.subtract_value_1 = subtract_value_1
        self.subtract_value_2 = subtract_value_2

    def forward(self, x):
        x = self.conv(x)
        x = x - self.subtract_value_1
        x = x - self.subtract_value_2
        return F.mish(x)


batch_size = 32
in_channels = 3
out_channels = 16
height, width = 64, 64
kernel_size = 3
subtract_value_1 = 0.5
subtract_value_2 = 0.2


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, subtract_value_1, subtract_value_2]
