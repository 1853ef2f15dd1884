import torch
import torch.nn as nn


class Model(nn.Module):
    """ConvTranspose2d whose stride (3) exceeds its kernel (2): one output row and column in three get no tap at
    all (the bias alone), then sigmoid and a scalar multiply."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, out_channels, 2, stride=3, output_padding=1)

    def forward(self, x):
        return torch.sigmoid(self.up(x)) * 3.0


batch_size = 3
in_channels = 10
out_channels = 9
height, width = 8, 11


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
