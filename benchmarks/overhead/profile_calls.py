"""Where a generated ModelNew's per-call time goes on a GPU: wall time per call with the GPU kept busy
(calls queued back to back, one sync at the end) against GPU time per call (CUDA events), and a cProfile of
the Python side (of the launches, without the CUDA graph). For small problems (problems/gemm/33: 1000 x 1000 -> 999)
launch and launcher overhead, not the kernels, can set the pace.

    PYTHONPATH=src python3 benchmarks/overhead/profile_calls.py problems/gemm/33_gemm_layernorm_relu_odd.py \
        [--calls 200]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path

import torch

from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problem", type=Path)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=35)
    args = ap.parse_args()
    prob = load_problem(args.problem)
    path = Path(tempfile.mkdtemp()) / f"{prob.name}_new.py"
    path.write_text(compile_problem(prob, Options(device="cuda")).source)
    mod = load_module(path)
    torch.manual_seed(0)
    eager = prob.build(device="cuda")
    fused = prob.build(cls=mod.ModelNew, device="cuda")
    fused.load_state_dict(eager.state_dict())
    inputs = prob.inputs(device="cuda")
    models = [("eager", eager), ("kfuse", fused)]
    launches = getattr(fused, "fused_forward", None)  # a graphed ModelNew: its launches without the CUDA graph
    if launches is not None:
        models.append(("kfuse launches", launches))
    for name, model in models:
        with torch.no_grad():
            for _ in range(10):
                model(*inputs)  # compile, tune, warm
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                model(*inputs)
            t_queue = (time.perf_counter() - t0) / args.calls * 1e3  # CPU time to issue one call
            torch.cuda.synchronize()
            t_wall = (time.perf_counter() - t0) / args.calls * 1e3
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            gpu = []
            for _ in range(20):
                torch.cuda.synchronize()
                start.record()
                model(*inputs)
                end.record()
                end.synchronize()
                gpu.append(start.elapsed_time(end))
        gpu.sort()
        print(f"{name}: issue {t_queue:.4f} ms/call, wall (queued) {t_wall:.4f} ms/call, "
              f"events (synced each call) median {gpu[len(gpu) // 2]:.4f} ms")
    # the GPU side: each kernel's time over 20 forwards (torch.profiler's CUDA activity)
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
        for _ in range(20):
            fused(*inputs)
        torch.cuda.synchronize()
    print(tp.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
    prof = cProfile.Profile()
    with torch.no_grad():
        prof.enable()
        for _ in range(args.calls):
            (launches or fused)(*inputs)
        prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
