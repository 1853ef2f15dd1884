import torch
import torch.nn as nn


class Model(nn.Module):
    """ConvTranspose2d (stride 2, output_padding 1) -> x a scalar -> global average pool -> + a (C, 1, 1) bias ->
    logsumexp over channels (KernelBench level 2 problems 42's and 44's ops): the mean is summed in the stride phases'
    own tiles (float64 per sample, phase and row tile), so the convolution's output is never stored; the logsumexp of
    one value per (sample, channel) stays a torch call."""

    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=2, padding=1,
                                                 output_padding=1)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv_transpose(x) * 0.5
        x = torch.mean(x, dim=(2, 3), keepdim=True)
        x = x + self.bias
        return torch.logsumexp(x, dim=1, keepdim=True)


batch_size = 3
in_channels = 5
out_channels = 11
height, width = 13, 10
kernel_size = 3
bias_shape = (out_channels, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
