import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv1d on a batch of one ('valid', even kernel), multiplied by a learned one-element parameter, clamped
    below (torch.clamp with min only) and above (the method with max only), then exp."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size)
        self.gain = nn.Parameter(torch.tensor([0.75]))

    def forward(self, x):
        y = self.conv(x) * self.gain
        return torch.exp(torch.clamp(y, min=-2.0).clamp(max=1.5))


batch_size = 1
in_channels = 11
out_channels = 6
length = 45
kernel_size = 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
