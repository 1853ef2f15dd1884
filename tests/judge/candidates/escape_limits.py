"""ATTACK limits: take more memory, processes and file space than the judge allows (the test sets low
limits and fills in the sizes). A success is reported as an error with ESCAPED. Computes the right answer."""

import os
import signal
import time

import torch
import torch.nn as nn

MEMORY_BYTES = 0  # filled in by the test
FORKS = 0
FILE_BYTES = 0


def _escapes():
    found = []
    if MEMORY_BYTES:
        try:
            block = bytearray(MEMORY_BYTES)
            found.append(f"allocated {len(block)} bytes")
            del block
        except MemoryError:
            pass
    if FORKS:
        children = []
        for _ in range(FORKS):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(5)
                os._exit(0)
            children.append(pid)
        if len(children) == FORKS:
            found.append(f"started {FORKS} processes")
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if FILE_BYTES:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails instead of killing us
        try:
            with open("/tmp/big", "wb") as f:
                f.write(b"\0" * FILE_BYTES)
            found.append(f"wrote a {FILE_BYTES}-byte file")
        except OSError:
            pass
        try:
            os.unlink("/tmp/big")
        except OSError:
            pass
    return found


ESCAPES = _escapes()


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        if ESCAPES:
            raise RuntimeError("ESCAPED: " + "; ".join(ESCAPES))
        return torch.relu(x) * self.scale
