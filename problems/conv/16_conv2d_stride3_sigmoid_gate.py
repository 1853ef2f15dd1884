import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d with stride 3 and a 5x5 kernel on odd sizes, then x * sigmoid(x) written out by hand, then abs."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=3, padding=2)

    def forward(self, x):
        y = self.conv(x)
        return torch.abs(y * torch.sigmoid(y))


batch_size = 4
in_channels = 5
out_channels = 17
height, width = 61, 47
kernel_size = 5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
