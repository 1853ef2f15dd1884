import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Linear, swish (sigmoid(x) * x), bias parameter, GroupNorm (512-channel groups: wider than a column tile).
    """

    def __init__(self, in_features, out_features, num_groups):
        super(Model, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(out_features) * 0.02)
        self.group_norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x):
        x = self.matmul(x)
        x = torch.sigmoid(x) * x
        x = x + self.bias
        x = self.group_norm(x)
        return x


batch_size = 1024
in_features = 8192
out_features = 8192
num_groups = 16


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]
