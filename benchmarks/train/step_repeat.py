"""Does a training step's time depend on what ran before it? time_cuda (the bench's method) on the ModelNew step
from a cold start, then after eager's steps, then 100 runs in a row, printing each timing's median and its
first and last runs. Run it with `nvidia-smi --query-gpu=clocks.sm,power.draw,... -lms 200` in the background
to see the clocks that go with each phase.

    PYTHONPATH=src python3 benchmarks/train/step_repeat.py PROBLEM
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from kfuse.timing import L2_FLUSH_BYTES, MIN_RUNS
from steps import training_steps


def runs(fn, n: int) -> list[float]:
    """time_cuda's loop, keeping every run's time."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in ev:
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]


def show(label: str, t: list[float]) -> None:
    print(f"{time.strftime('%H:%M:%S')} {label}: median {statistics.median(t):.3f} ms over {len(t)}; "
          f"first {' '.join(f'{x:.2f}' for x in t[:5])}; last {' '.join(f'{x:.2f}' for x in t[-5:])}", flush=True)


def main() -> None:
    s = training_steps(sys.argv[1])
    k, e = s.fused_step, s.eager_step
    k()
    torch.cuda.synchronize()
    time.sleep(5)
    show("kfuse, cold", runs(k, MIN_RUNS))
    show("eager", runs(e, MIN_RUNS))
    show("kfuse, after eager", runs(k, MIN_RUNS))
    show("kfuse, 100 in a row", runs(k, 100))
    time.sleep(5)
    show("kfuse, after 5 s idle", runs(k, MIN_RUNS))


if __name__ == "__main__":
    main()
