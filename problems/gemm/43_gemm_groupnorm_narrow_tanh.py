import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Linear, GroupNorm with 9-channel groups (narrower than a column tile, not a power of two, straddling
    the tile edges), Tanh.
    """

    def __init__(self, in_features, out_features, num_groups):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x):
        x = self.gemm(x)
        x = self.group_norm(x)
        x = torch.tanh(x)
        return x


batch_size = 1024
in_features = 8192
out_features = 8190
num_groups = 910


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]
