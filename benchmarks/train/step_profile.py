"""Where a ModelNew training step's GPU time goes: torch.profiler over 5 steps (after 3 warm-up steps), CUDA
kernels sorted by total time, per step. For deciding what to fuse or speed up next (times under the profiler are
not bench numbers).

    PYTHONPATH=src python3 benchmarks/train/step_profile.py PROBLEM...
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from steps import training_steps

STEPS = 5


def main() -> None:
    for arg in sys.argv[1:]:
        s = training_steps(arg)
        step = s.warm_fused()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
        rows = [(e.key, e.device_time_total / STEPS / 1e3, e.count // STEPS) for e in prof.key_averages()
                if e.device_time_total > 0]
        rows.sort(key=lambda r: -r[1])
        total = sum(r[1] for r in rows)
        print(f"{s.name}: GPU time per step {total:.3f} ms (kernels, under the profiler)")
        for key, ms, n in rows[:20]:
            print(f"  {ms:8.3f} ms  x{n:<3} {key[:110]}")


if __name__ == "__main__":
    main()
