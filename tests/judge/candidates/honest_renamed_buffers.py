"""Honest control: BatchNorm written by hand (training mode), its buffers named differently from Model's."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(features))
        self.shift = nn.Parameter(torch.zeros(features))
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("var", torch.ones(features))
        self.register_buffer("seen", torch.tensor(0, dtype=torch.long))

    def forward(self, x):
        mean = x.mean(0)
        var = x.var(0, unbiased=False)
        with torch.no_grad():
            self.mean.mul_(0.9).add_(0.1 * mean)
            self.var.mul_(0.9).add_(0.1 * x.var(0, unbiased=True))
            self.seen.add_(1)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.gain + self.shift
