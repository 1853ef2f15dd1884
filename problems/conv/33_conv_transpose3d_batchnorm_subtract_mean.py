import torch
import torch.nn as nn


class Model(nn.Module):
    """ConvTranspose3d (stride 2, output_padding 1) -> BatchNorm3d (momentum None: cumulative average) -> minus the
    spatial mean (KernelBench level 2 problem 15's ops): the norm's statistics come from stride-phase tiles of
    different sizes (explicit row counts); the spatial mean after it stays a torch call."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.ConvTranspose3d(in_channels, out_channels, 3, stride=2, padding=1, output_padding=1)
        self.bn = nn.BatchNorm3d(out_channels, momentum=None)

    def forward(self, x):
        x = self.bn(self.conv(x))
        return x - torch.mean(x, dim=(2, 3, 4), keepdim=True)


batch_size = 3
in_channels = 5
out_channels = 7
depth, height, width = 3, 5, 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
