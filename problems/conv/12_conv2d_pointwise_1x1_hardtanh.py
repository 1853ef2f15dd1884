import torch
import torch.nn as nn


class Model(nn.Module):
    """A 1x1 (pointwise) Conv2d, then Hardtanh: the convolution is a plain GEMM over channels."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 1)
        self.act = nn.Hardtanh(-0.5, 0.75)

    def forward(self, x):
        return self.act(self.conv(x))


batch_size = 8
in_channels = 96
out_channels = 40
height, width = 33, 31


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
