"""Where the judge's clock and CUDA events disagree (an H100 run: ~5 ms more per call on the judge's clock).

In one process, no worker: a strict-fp32 GEMM (1024 x 8192 -> 8192, problems/gemm/01's size) timed
- `events`: back to back with CUDA events (kfuse.timing.time_cuda), the in-worker figure;
- `wall_hot`: perf_counter around call + synchronize, calls back to back;
- `wall_after_stage`: the same, each call after a staging step like the worker's (host->device copy of a fresh
  input, a 256 MB L2 flush, synchronize), the GPU otherwise idle for `idle_ms`;
- `wall_clone_fresh`: as `wall_after_stage`, with the output cloned into a list kept for the batch inside the
  timed window (what `go` did: each clone a new cudaMalloc once the cache is empty);
- `wall_clone_reserved`: the same after the batch's bytes were allocated and freed once (what `stage`'s
  `reserve` now does).
Usage: python benchmarks/judge/clock_diag.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from kfuse import timing


def gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.t()


def wall(fn, runs: int, before=None) -> float:
    times = []
    for _ in range(runs):
        if before is not None:
            before()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(out_path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    m, k, n = 1024, 8192, 8192
    w = torch.randn(n, k, device="cuda")
    host = torch.randn(m, k)
    x = host.cuda()
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    idle_ms = 30.0

    def stage() -> None:
        nonlocal x
        x = host.clone().cuda()
        flush.zero_()
        torch.cuda.synchronize()
        time.sleep(idle_ms / 1e3)

    res: dict[str, float | str] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                   "shape": f"{m}x{k}->{n}", "idle_ms": idle_ms}
    res["events"] = timing.time_cuda(lambda: gemm(x, w), warmup=5, runs=50).median_ms
    res["wall_hot"] = wall(lambda: gemm(x, w), 50)
    res["wall_after_stage"] = wall(lambda: gemm(x, w), 30, stage)
    kept: list[torch.Tensor] = []
    torch.cuda.empty_cache()
    res["wall_clone_fresh"] = wall(lambda: kept.append(gemm(x, w).clone()), 30, stage)
    kept.clear()
    torch.cuda.empty_cache()
    torch.empty(30 * m * n * 4 + (64 << 20), dtype=torch.uint8, device="cuda")
    res["wall_clone_reserved"] = wall(lambda: kept.append(gemm(x, w).clone()), 30, stage)
    kept.clear()
    for idle in (0.0, 5.0, 100.0):
        idle_ms = idle
        res[f"wall_after_stage_idle{int(idle)}"] = wall(lambda: gemm(x, w), 20, stage)
    print(json.dumps(res, indent=1))
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
