import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    A two-layer MLP: Linear, ReLU, Linear, GELU.
    """

    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.fc1 = nn.Linear(in_features, out_features)
        self.fc2 = nn.Linear(out_features, out_features)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = self.fc2(x)
        return F.gelu(x)


batch_size = 2048
in_features = 8192
out_features = 8192


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
