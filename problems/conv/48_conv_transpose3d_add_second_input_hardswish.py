import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A transposed Conv3d, a second input of its output's shape added, x * hardswish(x), a per-channel bias: the
    second input is read inside the convolution's epilogue (KernelBench level 2 problem 26's pattern)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.1)

    def forward(self, x, add_input):
        x = self.conv_transpose(x)
        x = x + add_input
        x = x * F.hardswish(x)
        return x + self.bias


batch_size = 5
in_channels = 7
out_channels = 12
depth, height, width = 5, 9, 6
kernel_size = 3
stride = 2
padding = 1
output_padding = 1
bias_shape = (out_channels, 1, 1, 1)


def out_size(n):
    return (n - 1) * stride - 2 * padding + kernel_size + output_padding


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width),
            torch.randn(batch_size, out_channels, out_size(depth), out_size(height), out_size(width))]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape]
