import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Batch-1 Conv1d (dilation 2) -> tanh -> F.avg_pool1d(4, stride 3, padding 2, ceil_mode, count_include_pad
    False) -> x 2: overlapping windows, the last one past the conv output's end (ceil mode), divisors that count
    only the conv pixels a window covers."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=2)

    def forward(self, x):
        x = torch.tanh(self.conv(x))
        x = F.avg_pool1d(x, 4, stride=3, padding=2, ceil_mode=True, count_include_pad=False)
        return x * 2.0


batch_size = 1
in_channels = 6
out_channels = 10
length = 37
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
