import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv3d (batch 1, kernel (3, 2, 3), stride (1, 2, 1)) -> softmax over the channels -> + a (C, 1, 1, 1) bias ->
    x scale -> sigmoid (KernelBench level 2 problems 49 and 91's ops on a Conv3d): the softmax needs each pixel's
    logsumexp over all channels before any value can be normalized."""

    def __init__(self, in_channels, out_channels, scaling_factor):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, (3, 2, 3), stride=(1, 2, 1))
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1, 1))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.conv(x)
        x = torch.softmax(x, dim=1)
        x = (x + self.bias) * self.scaling_factor
        return torch.sigmoid(x)


batch_size = 1
in_channels = 3
out_channels = 19
depth, height, width = 7, 9, 10
scaling_factor = 2.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, scaling_factor]
