import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d (3 groups, stride 2, padding 1) -> logsumexp over the channels (keepdim) -> x * sigmoid(x + 3) / 6 ->
    minus a one-element bias -> clamp(-1, 1) (KernelBench level 2 problem 58's ops on a grouped Conv2d): a pixel's
    channels lie in three groups' column tiles, merged with a running max."""

    def __init__(self, in_channels, out_channels, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1, groups=groups)
        self.bias = nn.Parameter(torch.randn(1, 1, 1, 1))

    def forward(self, x):
        x = self.conv(x)
        x = torch.logsumexp(x, dim=1, keepdim=True)
        x = x * torch.sigmoid(x + 3) / 6
        x = x - self.bias
        return torch.clamp(x, min=-1, max=1)


batch_size = 4
in_channels = 6
out_channels = 21
groups = 3
height, width = 15, 12


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, groups]
