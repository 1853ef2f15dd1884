import torch
import torch.nn as nn


class Model(nn.Module):
    """A Conv2d whose output is kept as a detached copy and added back and multiplied in (KernelBench level 2
    problem 20's pattern, in 2-d at odd sizes): `.detach()` is a view inside the epilogue, and the gradient must not
    flow through the copy."""

    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=2, padding=1)
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.1)

    def forward(self, x):
        x = self.conv(x)
        original_x = x.clone().detach()
        x = x + self.bias
        x = x + original_x
        x = x * original_x
        return x + original_x


batch_size = 6
in_channels = 5
out_channels = 10
height, width = 13, 17
kernel_size = 3
bias_shape = (out_channels, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
