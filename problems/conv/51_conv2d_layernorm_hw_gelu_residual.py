import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d -> LayerNorm over (H, W) with its affine -> GELU -> + the conv's own output (KernelBench level 2
    problems 3's and 34's LayerNorm over trailing dims of a convolution's output): the rows a norm covers are spread
    over the convolution's tiles, so the region stores y, merges each row's moments in float64 and applies the norm
    and the ops after it in one pass over y."""

    def __init__(self, in_channels, out_channels, kernel_size, out_height, out_width):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.norm = nn.LayerNorm((out_height, out_width))

    def forward(self, x):
        y = self.conv(x)
        return torch.nn.functional.gelu(self.norm(y)) + y


batch_size = 3
in_channels = 5
out_channels = 7
height, width = 13, 17
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, height, width]
