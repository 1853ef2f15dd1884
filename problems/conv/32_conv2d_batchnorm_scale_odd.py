import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d (stride 2, padding (2, 1), 3x4 kernel) -> BatchNorm2d -> x scale (KernelBench level 2 problem 73's
    ops at odd sizes): training-mode batch statistics over row tiles of N x 10 x 6 pixels, running statistics
    updated; eval folds the norm into the conv's weight and bias."""

    def __init__(self, in_channels, out_channels, scaling_factor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, (3, 4), stride=2, padding=(2, 1))
        self.bn = nn.BatchNorm2d(out_channels)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        return x * self.scaling_factor


batch_size = 5
in_channels = 6
out_channels = 13
height, width = 17, 9
scaling_factor = 1.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, scaling_factor]
