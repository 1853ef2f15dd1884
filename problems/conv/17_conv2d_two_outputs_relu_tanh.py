import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d whose output feeds two results: relu(y) and tanh(y) * 2, returned as a tuple."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y), torch.tanh(y) * 2.0


batch_size = 3
in_channels = 6
out_channels = 20
height, width = 29, 30
kernel_size = 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
