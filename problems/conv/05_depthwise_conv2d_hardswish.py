import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Depthwise Conv2d (groups = channels), then HardSwish."""

    def __init__(self, channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)

    def forward(self, x):
        return F.hardswish(self.conv(x))


batch_size = 16
channels = 32
height, width = 56, 56
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, kernel_size]
