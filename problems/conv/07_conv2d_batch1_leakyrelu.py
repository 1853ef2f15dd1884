import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d on a batch of one, then LeakyReLU."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.act = nn.LeakyReLU(0.2)

    def forward(self, x):
        return self.act(self.conv(x))


batch_size = 1
in_channels = 3
out_channels = 24
height, width = 127, 129
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
