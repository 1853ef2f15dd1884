import torch
import torch.nn as nn


class Model(nn.Module):
    """ConvTranspose2d with stride 2 and output_padding 1, then ReLU (fused: kernels/conv_transpose.py's stride
    phases, the ReLU on the accumulator)."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=2, padding=1,
                                         output_padding=1)

    def forward(self, x):
        return torch.relu(self.deconv(x))


batch_size = 4
in_channels = 16
out_channels = 9
height, width = 13, 11
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
