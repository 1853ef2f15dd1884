import torch
import torch.nn as nn


class Model(nn.Module):
    """ConvTranspose1d with stride 3, padding 1, output_padding 2 and dilation 2 (the tap step per stride phase is
    the dilation itself: gcd(3, 2) = 1), then GELU."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.up = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=3, padding=1, output_padding=2,
                                     dilation=2)

    def forward(self, x):
        return torch.nn.functional.gelu(self.up(x))


batch_size = 5
in_channels = 12
out_channels = 7
length = 29
kernel_size = 5


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
