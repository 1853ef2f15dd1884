import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv1d (kernel 5, padding 2) -> F.group_norm in 2 groups of 75 channels -> SiLU: a group wider than a column
    tile (64 channels in the interpreter, 128 on a GPU) and than a row tile on a GPU (97 positions x 75 channels),
    straddling the column tiles, so its statistics are merged from many tiles' partials."""

    def __init__(self, in_channels, out_channels, num_groups):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, 5, padding=2)
        self.num_groups = num_groups
        self.gn_weight = nn.Parameter(torch.randn(out_channels))
        self.gn_bias = nn.Parameter(torch.randn(out_channels))

    def forward(self, x):
        x = F.group_norm(self.conv(x), self.num_groups, self.gn_weight, self.gn_bias, 1e-5)
        return F.silu(x)


batch_size = 4
in_channels = 7
out_channels = 150
num_groups = 2
length = 97


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, num_groups]
