import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Linear, BatchNorm1d (training), GroupNorm, GELU, mean over features, ReLU.
    (GroupNorm before the GELU: the row mean of a GroupNorm output is its bias' mean, a constant.)
    """

    def __init__(self, in_features, out_features, num_groups):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.batch_norm = nn.BatchNorm1d(out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x):
        x = self.gemm(x)
        x = self.batch_norm(x)
        x = self.group_norm(x)
        x = F.gelu(x)
        x = torch.mean(x, dim=1, keepdim=True)
        x = torch.relu(x)
        return x


batch_size = 1024
in_features = 8192
out_features = 8192
num_groups = 32


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]
