"""Broken candidate: a syntax error (must give compiled=false, not stop the judge)."""

import torch.nn as nn


class ModelNew(nn.Module)
    pass
