"""ATTACK log_flood: 96 MiB on stdout, then exit (the issue's 3 GB flood got the judge OOM-killed when it
read the log)."""

import os

import torch.nn as nn

chunk = b"flood " * (1 << 20)
for _ in range(16):
    os.write(1, chunk)
os._exit(3)


class ModelNew(nn.Module):
    pass
