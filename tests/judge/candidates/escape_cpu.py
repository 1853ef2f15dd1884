"""ATTACK cpu_time: spins forever at import, ignoring the judge's timeout from inside (the kernel's CPU-time
limit ends it, whatever the judge's own clock does)."""

import torch.nn as nn

while True:
    pass


class ModelNew(nn.Module):
    pass
