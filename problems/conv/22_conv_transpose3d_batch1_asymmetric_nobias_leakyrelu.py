import torch
import torch.nn as nn


class Model(nn.Module):
    """ConvTranspose3d on a batch of one: asymmetric kernel (3, 2, 3) and strides (2, 1, 2), output_padding
    (1, 0, 1), padding (1, 0, 1), no bias, odd sizes, then LeakyReLU."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.up = nn.ConvTranspose3d(in_channels, out_channels, (3, 2, 3), stride=(2, 1, 2), padding=(1, 0, 1),
                                     output_padding=(1, 0, 1), bias=False)
        self.act = nn.LeakyReLU(0.2)

    def forward(self, x):
        return self.act(self.up(x))


batch_size = 1
in_channels = 6
out_channels = 5
depth, height, width = 5, 7, 6


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
