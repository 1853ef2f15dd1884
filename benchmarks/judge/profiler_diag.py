"""How long a CUDA profiling session takes to start, stop and read, first and later in one process (the judge's
worker profiles one correctness call per candidate to count its kernels).
Usage: python benchmarks/judge/profiler_diag.py"""

from __future__ import annotations

import json
import time

import torch

ACTIVITY = torch.profiler.ProfilerActivity.CUDA


def session(x: torch.Tensor) -> dict:
    t0 = time.perf_counter()
    prof = torch.profiler.profile(activities=[ACTIVITY])
    prof.__enter__()
    t1 = time.perf_counter()
    torch.nn.functional.gelu(x @ x)
    torch.cuda.synchronize()
    prof.__exit__(None, None, None)
    t2 = time.perf_counter()
    names = [str(e.name) for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    t3 = time.perf_counter()
    return {"enter_s": round(t1 - t0, 3), "exit_s": round(t2 - t1, 3), "read_s": round(t3 - t2, 3),
            "kernels": len(names)}


def main() -> None:
    t0 = time.perf_counter()
    x = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    out = {"cuda_init_s": round(time.perf_counter() - t0, 3)}
    for label in ("first", "second", "third"):
        out[label] = session(x)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
