import torch
import torch.nn as nn


class Model(nn.Module):
    """ConvTranspose2d with dilation 3, stride 2, padding 4 (wider than the kernel), output_padding 2 (allowed:
    below the dilation), odd sizes, then exp(-|y|) and a subtraction of a scalar."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=2, padding=4, output_padding=2,
                                     dilation=3)

    def forward(self, x):
        return torch.exp(-torch.abs(self.up(x))) - 0.5


batch_size = 2
in_channels = 9
out_channels = 8
height, width = 10, 7
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
