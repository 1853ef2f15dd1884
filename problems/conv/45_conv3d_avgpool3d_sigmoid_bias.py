import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv3d (stride (1, 2, 2), no bias) -> ReLU -> AvgPool3d(2) (non-overlapping; floor mode drops the odd last
    plane, row and column) -> + a (C, 1, 1, 1) bias -> sigmoid, at odd sizes."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, 3, stride=(1, 2, 2), padding=1, bias=False)
        self.pool = nn.AvgPool3d(2)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1, 1))

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = self.pool(x)
        return torch.sigmoid(x + self.bias)


batch_size = 2
in_channels = 3
out_channels = 7
depth, height, width = 7, 11, 9


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
