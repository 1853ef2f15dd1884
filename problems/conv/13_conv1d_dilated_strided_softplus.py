import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv1d with stride 2, dilation 3 and padding 4, then softplus and a scalar scale."""

    def __init__(self, in_channels, out_channels, kernel_size, scale):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride=2, padding=4, dilation=3)
        self.scale = scale

    def forward(self, x):
        return F.softplus(self.conv(x)) * self.scale


batch_size = 6
in_channels = 7
out_channels = 19
length = 301
kernel_size = 5
scale = 0.37


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, scale]
