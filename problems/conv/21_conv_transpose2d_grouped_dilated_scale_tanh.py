import torch
import torch.nn as nn


class Model(nn.Module):
    """Grouped ConvTranspose2d (3 groups) with stride 2, dilation 2 (every tap in one stride phase: the other phase
    is the bias alone), padding 2, output_padding 1, then a learned (C, 1, 1) scale and tanh."""

    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=2, padding=2, output_padding=1,
                                     groups=groups, dilation=2)
        self.scale = nn.Parameter(torch.randn(out_channels, 1, 1) * 0.5 + 1.0)

    def forward(self, x):
        return torch.tanh(self.up(x) * self.scale)


batch_size = 3
in_channels = 12
out_channels = 15
groups = 3
height, width = 11, 9
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups]
