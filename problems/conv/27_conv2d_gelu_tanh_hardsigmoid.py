import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv2d with a 3x5 kernel and padding (1, 2) on odd sizes, then GELU's tanh approximation and hardsigmoid."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, (3, 5), padding=(1, 2))

    def forward(self, x):
        return F.hardsigmoid(F.gelu(self.conv(x), approximate="tanh"))


batch_size = 3
in_channels = 7
out_channels = 13
height, width = 15, 17


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
