"""ATTACK judge_process: find the judge among the processes, then signal it (SIGSTOP would hang it) or open
its memory (/proc/<pid>/mem: write the judge's comparison). Harmless probes here: signal 0 and a read-only
open; a success is reported as an error with ESCAPED, so the test sees it. Computes the right answer."""

import os

import torch
import torch.nn as nn


def _reach_judge():
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if (b"pytest" in cmd or b"kfuse" in cmd) and b"kfuse.judge.worker" not in cmd:
            try:
                os.kill(int(entry), 0)
                found.append(f"can signal {entry}")
            except OSError:
                pass
            try:
                open(f"/proc/{entry}/mem", "rb").close()
                found.append(f"can open /proc/{entry}/mem")
            except OSError:
                pass
    return found


REACHED = _reach_judge()


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        if REACHED:
            raise RuntimeError("ESCAPED: " + "; ".join(REACHED[:3]))
        return torch.relu(x) * self.scale
