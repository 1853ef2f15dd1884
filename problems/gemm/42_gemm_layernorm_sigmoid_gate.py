import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Linear, y * sigmoid(LayerNorm(y)).
    """

    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features, elementwise_affine=False)

    def forward(self, x):
        y = self.gemm(x)
        return y * torch.sigmoid(self.norm(y))


batch_size = 128
in_features = 32768
out_features = 32768


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
