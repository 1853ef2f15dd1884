"""ATTACK seed_prediction: the worker's RNG is seeded with the judge's seed before ModelNew is built; with
it the candidate predicts the judge's input draws (the former seed scheme: base + 1 + i, drawn after
manual_seed(s + 1000003)) and could precompute answers. A hit is reported as an error with ESCAPED."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        seed = torch.initial_seed()
        state = torch.get_rng_state()
        self.predicted = []
        for i in range(8):
            torch.manual_seed(seed + 1 + i + 1_000_003)
            self.predicted.append(torch.randn(16, in_features))
        torch.set_rng_state(state)

    def forward(self, x):
        if any(p.shape == x.shape and torch.equal(p, x) for p in self.predicted):
            raise RuntimeError("ESCAPED: predicted the judge's input draw")
        return torch.relu(F.linear(x, self.linear.weight, self.linear.bias))
