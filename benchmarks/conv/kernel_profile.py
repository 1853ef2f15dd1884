"""Where a problem's time goes, kernel by kernel: kfuse's ModelNew against eager Model, under torch.profiler.

    python3 benchmarks/conv/kernel_profile.py OUT.json FILE... [--runs N] [--set NAME=VALUE ...]

`kfuse bench` gives one number per problem; the conv family's slowest problems (benchmarks/conv/NOTES.md, "The 21
level 2 problems slower than eager") are 4-115x above their floors and nobody knows which pass is the excess: the
packing pass, the tile, a norm kind's statistics and apply passes, or host gaps between launches. For each FILE
this builds ModelNew as `kfuse bench` does (load_kfuse: same tuner, weights copied from Model), warms both models
up, then records `--runs` forward calls of each under the profiler and reports, per model: wall time per call
(CUDA events around the recorded calls), the sum of kernel time per call, their difference (host gaps: time the
device sat idle), and every kernel's time per call and launches per call, largest first. On a machine without a GPU
it runs on the CPU at the file's sizes (CPU op times; useful only to check the script).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from kfuse.bench import load_kfuse
from kfuse.load import load_problem, parse_set


def kernel_table(prof: profile, runs: int, device: str) -> list[dict[str, Any]]:
    """Per kernel name: microseconds and launches per call, from the profiler's device events (CPU ops on the CPU)."""
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for ev in prof.events():
        on_device = ev.device_type == torch.autograd.DeviceType.CUDA
        if device == "cuda" and not on_device:
            continue
        if device != "cuda" and (on_device or ev.cpu_parent is not None):
            continue  # on the CPU: top-level ops only, not their children twice
        total[ev.name] += ev.device_time_total if on_device else ev.cpu_time_total
        count[ev.name] += 1
    rows = [{"kernel": k[:160], "us_per_call": round(v / runs, 2), "launches_per_call": count[k] / runs}
            for k, v in total.items()]
    return sorted(rows, key=lambda r: -r["us_per_call"])


def profile_model(model: torch.nn.Module, inputs: list[Any], device: str, runs: int, warmup: int) -> dict[str, Any]:
    with torch.no_grad():
        for _ in range(warmup):
            model(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            for _ in range(runs):
                model(*inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - t0) * 1e3 / runs
    kernels = kernel_table(prof, runs, device)
    busy_ms = sum(k["us_per_call"] for k in kernels) / 1e3
    return {"wall_ms_per_call": round(wall_ms, 4), "kernel_ms_per_call": round(busy_ms, 4),
            "idle_ms_per_call": round(max(wall_ms - busy_ms, 0.0), 4),
            "launches_per_call": sum(k["launches_per_call"] for k in kernels), "kernels": kernels}


def profile_file(path: Path, overrides: dict[str, Any], device: str, runs: int, warmup: int,
                 workdir: Path) -> dict[str, Any]:
    problem = load_problem(path, overrides)
    module = load_kfuse(problem, device, workdir)
    torch.manual_seed(0)
    eager = problem.build(device=device)
    torch.manual_seed(0)
    fused = problem.build(cls=module.ModelNew, device=device)
    fused.load_state_dict(eager.state_dict())
    torch.manual_seed(1)
    inputs = problem.inputs(device=device)
    return {"file": path.name, "device": device, "overrides": overrides, "runs": runs,
            "eager": profile_model(eager, inputs, device, runs, warmup),
            "kfuse": profile_model(fused, inputs, device, runs, warmup)}


def summary_line(rec: dict[str, Any]) -> str:
    k, e = rec["kfuse"], rec["eager"]
    top = ", ".join(f"{r['kernel'][:40]} {r['us_per_call']:.0f} us" for r in k["kernels"][:3])
    return (f"{rec['file']}: kfuse {k['wall_ms_per_call']:.3f} ms ({k['kernel_ms_per_call']:.3f} in kernels, "
            f"{k['launches_per_call']:.0f} launches), eager {e['wall_ms_per_call']:.3f} ms; top: {top}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    overrides = parse_set(args.sets)
    records = []
    with tempfile.TemporaryDirectory(prefix="kfuse-profile-") as tmp:
        for path in args.files:
            try:
                rec = profile_file(path, overrides, device, args.runs, args.warmup, Path(tmp))
                print(summary_line(rec), flush=True)
            except Exception as err:  # one problem's failure is a record, not the end of the sweep
                rec = {"file": path.name, "error": f"{type(err).__name__}: {str(err)[:300]}"}
                print(f"{path.name}: {rec['error']}", flush=True)
            records.append(rec)
            args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name() if device == "cuda" else None,
                                            "torch": torch.__version__, "records": records}, indent=1))
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
