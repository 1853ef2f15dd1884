import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d -> tanh(softplus(x)) * x (torch.multiply) -> BatchNorm2d with eps 1e-3, momentum 0.3 (KernelBench level 2
    problem 52's ops): the activation runs before the norm in the statistics pass; eval normalizes with the running
    statistics in the epilogue (no fold: an op sits between the conv and the norm)."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(out_channels, eps=1e-3, momentum=0.3)

    def forward(self, x):
        x = self.conv(x)
        x = torch.multiply(torch.tanh(torch.nn.functional.softplus(x)), x)
        return self.bn(x)


batch_size = 4
in_channels = 3
out_channels = 11
height, width = 13, 7


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
