import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d (3x3, padding 1) -> subtract -> HardSwish -> MaxPool2d(3, stride 2, padding 1) -> Mish (KernelBench
    level 2 problem 35's ops with overlapping, padded windows, at odd sizes): each conv pixel lies in up to four
    windows, the pool's padding is -inf, the conv output (N x 11 x 15 x 13) never goes to memory."""

    def __init__(self, in_channels, out_channels, subtract_value):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.subtract_value = subtract_value
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, x):
        x = self.conv(x)
        x = x - self.subtract_value
        x = torch.nn.functional.hardswish(x)
        x = self.pool(x)
        return torch.nn.functional.mish(x)


batch_size = 3
in_channels = 5
out_channels = 11
height, width = 15, 13
subtract_value = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, subtract_value]
