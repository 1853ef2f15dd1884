import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d (5x3 kernel, padding (2, 0), no bias) -> InstanceNorm2d (affine) -> divide (KernelBench level 2
    problem 17's ops) at batch 1 and odd sizes: per-(sample, channel) statistics, i.e. GroupNorm with one channel a
    group, over 15 x 9 pixels."""

    def __init__(self, in_channels, out_channels, divide_by):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, (5, 3), padding=(2, 0), bias=False)
        self.instance_norm = nn.InstanceNorm2d(out_channels, affine=True)
        self.divide_by = divide_by

    def forward(self, x):
        x = self.conv(x)
        x = self.instance_norm(x)
        return x / self.divide_by


batch_size = 1
in_channels = 3
out_channels = 7
height, width = 15, 11
divide_by = 2.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, divide_by]
