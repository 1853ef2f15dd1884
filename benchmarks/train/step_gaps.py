"""Where a ModelNew training step's GPU time goes *between* kernels: the bench's loop (L2 flushed, then one step,
as kfuse.timing.time_cuda runs it) under torch.profiler, with the GPU timeline read from the Chrome trace.
Per step: the span from the first kernel after the flush to the last, the time kernels ran, and the largest idle
gaps with the kernels on either side. Also: host time per step (steps launched back to back after a sync, no
sync inside), and whether a step synchronizes the host anywhere (torch.cuda.set_sync_debug_mode("error")).

    PYTHONPATH=src python3 benchmarks/train/step_gaps.py PROBLEM...
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from kfuse.timing import L2_FLUSH_BYTES
from steps import training_steps

STEPS = 5
GPU_CATS = ("kernel", "gpu_memset", "gpu_memcpy")


def gpu_events(trace: Path) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every kernel, memset and memcpy in a Chrome trace, by start."""
    events = json.loads(trace.read_text())["traceEvents"]
    out = [(e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events if e.get("cat") in GPU_CATS]
    return sorted(out)


def steps_between_flushes(evs: list, flush_us: float) -> list[list]:
    """The timeline cut at the L2 flushes (the longest memsets/fills, one before each step)."""
    flushes = [i for i, (s, e, n) in enumerate(evs) if e - s >= flush_us and ("Fill" in n or "emset" in n)]
    return [evs[a + 1:b] for a, b in zip(flushes, flushes[1:] + [len(evs)])]


def describe(step: list) -> str:
    span = step[-1][1] - step[0][0]
    busy, gaps, end, prev = 0.0, [], step[0][0], ""
    for s, e, n in step:
        busy += max(0.0, e - max(s, end))
        if s > end:
            gaps.append((s - end, prev, n))
        end = max(end, e)
        prev = n
    gaps.sort(reverse=True)
    lines = [f"span {span / 1e3:.3f} ms, kernels busy {busy / 1e3:.3f} ms, idle {(span - busy) / 1e3:.3f} ms "
             f"in {len(gaps)} gaps, {len(step)} GPU events"]
    lines += [f"    gap {g:7.1f} us  after {a[:60]!r}  before {b[:60]!r}" for g, a, b in gaps[:12]]
    return "\n".join(lines)


def main() -> None:
    for arg in sys.argv[1:]:
        run = training_steps(arg)
        step = run.warm_fused()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
            print(f"{run.name}: no host synchronization inside a step")
        except RuntimeError:
            print(f"{run.name}: a step synchronizes the host here:")
            traceback.print_exc(limit=12)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            step()
        host = (time.perf_counter() - t0) / 10 * 1e3
        torch.cuda.synchronize()
        print(f"{run.name}: host time per step {host:.3f} ms (10 steps launched back to back)")
        flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                flush.zero_()
                step()
            torch.cuda.synchronize()
        trace = Path(tempfile.mkdtemp()) / "trace.json"
        prof.export_chrome_trace(str(trace))
        evs = gpu_events(trace)
        longest = max((e - s for s, e, n in evs if "Fill" in n or "emset" in n), default=0.0)
        for i, st in enumerate(steps_between_flushes(evs, 0.8 * longest)):
            if st:
                print(f"{run.name} step {i}: {describe(st)}")


if __name__ == "__main__":
    main()
