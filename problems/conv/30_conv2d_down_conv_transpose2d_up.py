import torch
import torch.nn as nn


class Model(nn.Module):
    """An encoder-decoder pair: Conv2d with stride 2 + ReLU, then ConvTranspose2d with stride 2 (no output_padding:
    odd sizes come back as they were, 13 x 15 -> 7 x 8 -> 13 x 15) + sigmoid. Two fused regions, one of each form."""

    def __init__(self, channels, hidden):
        super().__init__()
        self.down = nn.Conv2d(channels, hidden, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(hidden, channels, 3, stride=2, padding=1, output_padding=0)

    def forward(self, x):
        return torch.sigmoid(self.up(torch.relu(self.down(x))))


batch_size = 3
channels = 5
hidden = 12
height, width = 13, 15


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, hidden]
