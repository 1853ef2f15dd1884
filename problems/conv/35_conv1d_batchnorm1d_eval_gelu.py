import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv1d (dilation 2, no bias) -> BatchNorm1d in eval mode (set in the constructor, non-trivial running
    statistics) -> GELU: the model as constructed runs the eval forward, the norm folded into the conv's weight
    and a bias made from the running statistics (bn-eval-fold), one kernel."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, 3, dilation=2, bias=False)
        self.bn = nn.BatchNorm1d(out_channels)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)
        self.bn.eval()

    def forward(self, x):
        return torch.nn.functional.gelu(self.bn(self.conv(x)))


batch_size = 1
in_channels = 9
out_channels = 17
length = 41


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels]
