import torch
import torch.nn as nn


class Model(nn.Module):
    """ConvTranspose3d (stride 2, padding 1, output_padding 1) -> ReLU -> GroupNorm (3 groups of 3 channels) ->
    hardswish (KernelBench level 2 problems 60 and 61's ops) at odd sizes: the stride phases' row tiles hold
    different numbers of pixels a sample, and each phase's partials are segmented by sample."""

    def __init__(self, in_channels, out_channels, num_groups):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, 3, stride=2, padding=1, output_padding=1)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        x = torch.relu(self.conv_transpose(x))
        x = self.group_norm(x)
        return torch.nn.functional.hardswish(x)


batch_size = 3
in_channels = 4
out_channels = 9
num_groups = 3
depth, height, width = 3, 5, 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, num_groups]
