"""Interleaved A/B on the GPU: each problem's ModelNew with every GEMM forced to one of several configs
(sm90_ab.CONFIGS), the configs taking turns call by call, so that the GPU's clock (which falls as it warms under
three fp16 products: 1980 -> ~1785 MHz within seconds) weighs on every config alike. Each call is timed like the
bench (L2 flushed, CUDA events). Reports each config's median and its median ratio to the first config over the
rounds (paired: the same round's calls ran within a few milliseconds of each other).

Usage (GPU): python3 benchmarks/gemm/ab_interleaved.py PROBLEM --configs A,B,C [--rounds 60] [--json PATH]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kfuse.load import load_problem  # noqa: E402
from kfuse.optimize import Options, compile_problem, load_module  # noqa: E402
from kfuse.timing import L2_FLUSH_BYTES  # noqa: E402
from kfuse.verify import seeded_build, seeded_inputs  # noqa: E402
from sm90_ab import use_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problem")
    ap.add_argument("--configs", required=True)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    os.environ["KFUSE_AUTOTUNE"] = "0"
    names = args.configs.split(",")
    prob = load_problem(args.problem)
    mod_path = Path(tempfile.mkdtemp()) / f"{prob.name}_new.py"
    mod_path.write_text(compile_problem(prob, Options(device="cuda")).source)
    mod = load_module(mod_path)
    model = seeded_build(prob, 0, mod.ModelNew, device="cuda")
    inputs = seeded_inputs(prob, 0, device="cuda")
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    times = {n: [] for n in names}
    with torch.no_grad():
        for name in names:  # compile each config's kernels and warm up
            use_config(mod, name)
            for _ in range(3):
                model(*inputs)
        torch.cuda.synchronize()
        events = []
        for _ in range(args.rounds):
            for name in names:
                use_config(mod, name)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                flush.zero_()
                start.record()
                model(*inputs)
                end.record()
                events.append((name, start, end))
        torch.cuda.synchronize()
    for name, start, end in events:
        times[name].append(start.elapsed_time(end))
    base = names[0]
    row = {"problem": prob.name, "rounds": args.rounds, "configs": {}}
    for name in names:
        ratios = [t / b for t, b in zip(times[name], times[base])]
        row["configs"][name] = {"median_ms": round(statistics.median(times[name]), 4),
                                "p10_ms": round(sorted(times[name])[len(times[name]) // 10], 4),
                                "ratio_to_first": round(statistics.median(ratios), 4)}
    print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(row | {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                     "command": " ".join(sys.argv), "times_ms": times}, indent=1))


if __name__ == "__main__":
    main()
