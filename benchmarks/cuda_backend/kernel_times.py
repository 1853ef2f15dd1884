"""Where a `--backend cuda` ModelNew's forward spends its GPU time, kernel by kernel (torch.profiler's records):

    PYTHONPATH=src python3 benchmarks/cuda_backend/kernel_times.py PROBLEM.py [PROBLEM.py ...] [--json PATH]

Per problem at its file's sizes: ModelNew built from the Model's state (seed 0), 5 warm-up calls, then 20 calls under
the profiler; each kernel's total GPU time over the 20 calls / 20 (microseconds per forward), its launches per
forward, and the forward's time between two CUDA events (median of 5 rounds of 10 calls).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module

CALLS = 20


def short(name: str) -> str:
    """A kernel's name without its template arguments' detail (CUTLASS's run to thousands of characters)."""
    for key in ("SplitMainloop", "kf_split_rows_kernel", "kf_group_norm_kernel", "kf_col_stats_kernel",
                "kf_bn_finalize_kernel", "kf_bn_apply_kernel", "kf_bn_running_kernel", "kf_gemm_fp16x3p_kernel",
                "kf_conv_fp16x3p_kernel", "kf_conv_pack_kernel", "kf_sample_amax_kernel"):
        if key in name:
            return key if key != "SplitMainloop" else "sm90 GEMM (SplitMainloop)"
    return name[:80]


def forward_ms(model, inputs, rounds: int = 5, calls: int = 10) -> float:
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            model(*inputs)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def kernel_table(path: Path) -> dict:
    prob = load_problem(path)
    compiled = compile_problem(prob, Options(device="cuda", backend="cuda"))  # no verification: kfuse optimize's
    folder = Path(tempfile.mkdtemp())
    out = folder / f"{path.stem}_cuda.py"
    out.write_text(compiled.source)
    module = load_module(out)
    torch.manual_seed(0)
    model = prob.build(cls=module.ModelNew, device="cuda")
    inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in prob.inputs()]
    with torch.no_grad():
        for _ in range(5):
            model(*inputs)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                model(*inputs)
            torch.cuda.synchronize()
        ms = forward_ms(model, inputs)
    us, count = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us[short(e.name)] += e.device_time / CALLS
            count[short(e.name)] += 1
    kernels = {k: {"us_per_forward": round(v, 2), "launches_per_forward": count[k] / CALLS} for k, v in
               sorted(us.items(), key=lambda kv: -kv[1])}
    return {"problem": path.stem, "forward_ms": round(ms, 4), "kernels": kernels}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for p in args.problems:
        row = kernel_table(p)
        rows.append(row)
        print(f"{row['problem']}: forward {row['forward_ms']:.4f} ms")
        for k, v in row["kernels"].items():
            print(f"  {v['us_per_forward']:9.2f} us  x{v['launches_per_forward']:.0f}  {k}")
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "rows": rows},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
