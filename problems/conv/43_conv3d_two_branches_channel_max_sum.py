import torch
import torch.nn as nn


class Model(nn.Module):
    """Two Conv3d branches of one input: gelu -> max over the channels (torch.max(x, dim=1)[0], no keepdim, as
    KernelBench level 2 problem 79 ends), and x scale -> sum over the channels (keepdim, as problem 78 ends; summed in
    float64). Two regions, each a convolution with its channel reduction."""

    def __init__(self, in_channels, out_channels, scale):
        super().__init__()
        self.conv_a = nn.Conv3d(in_channels, out_channels, 3, padding=1)
        self.conv_b = nn.Conv3d(in_channels, out_channels, (1, 3, 3), bias=False)
        self.scale = scale

    def forward(self, x):
        a = torch.max(torch.nn.functional.gelu(self.conv_a(x)), dim=1)[0]
        b = torch.sum(self.conv_b(x) * self.scale, dim=1, keepdim=True)
        return a, b


batch_size = 2
in_channels = 4
out_channels = 67
depth, height, width = 5, 7, 6
scale = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, scale]
