import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Raw matmul against a (K, N) parameter, bias vector, tanh, scale.
    """

    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features) / in_features ** 0.5)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x):
        x = x @ self.weight
        x = x + self.bias
        return torch.tanh(x) * 2.0


batch_size = 16384
in_features = 4096
out_features = 4096


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
