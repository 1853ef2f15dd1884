import torch
import torch.nn as nn


class Model(nn.Module):
    """ConvTranspose1d on a batch of one with stride 2, padding 3 (wider than half the kernel), output_padding 1;
    returns the convolution's own output and hardsigmoid of it (two stores from one tile)."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.up = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=2, padding=3, output_padding=1)

    def forward(self, x):
        y = self.up(x)
        return y, nn.functional.hardsigmoid(y)


batch_size = 1
in_channels = 9
out_channels = 11
length = 37
kernel_size = 7


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
