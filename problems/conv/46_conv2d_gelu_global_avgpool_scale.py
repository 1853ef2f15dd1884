import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d -> GELU -> global average pool (x.mean over (2, 3)) -> x a per-channel scale -> tanh (KernelBench
    level 2 problem 67's ops and more): the mean is two-phase, float64 sums of each sample's pixel tiles, so it
    holds at any spatial size (here 21 x 19 conv pixels a sample, the contract's extra shape more)."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.scale = nn.Parameter(torch.randn(out_channels))

    def forward(self, x):
        x = torch.nn.functional.gelu(self.conv(x))
        x = x.mean((2, 3))
        return torch.tanh(x * self.scale)


batch_size = 4
in_channels = 3
out_channels = 9
height, width = 23, 21
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
