import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv1d with stride 2 and padding 1, then GELU."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride=2, padding=1)

    def forward(self, x):
        return F.gelu(self.conv(x))


batch_size = 32
in_channels = 16
out_channels = 48
length = 1023
kernel_size = 5


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
