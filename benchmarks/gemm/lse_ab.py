"""A/B in one process on one GPU: ModelNew files generated at two commits for the same problems, same state and
inputs, timed in alternating rounds (kfuse.timing.time_cuda, L2 flushed, >= 30 runs each). Used (gemm/lse_ab-v1.log)
for the softmax / log_softmax logsumexp as an fp32 pair (branch lse-hilo) against main.

    python benchmarks/gemm/lse_ab.py DIR STEM... [--rounds 3]   # DIR holds <stem>_main.py and <stem>_hilo.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from kfuse.load import load_problem
from kfuse.optimize import load_module
from kfuse.timing import time_cuda

GEMM = Path(__file__).resolve().parents[2] / "problems" / "gemm"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("stems", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for stem in args.stems:
        prob = load_problem(GEMM / f"{stem}.py")
        torch.manual_seed(0)
        eager = prob.build(device="cuda")
        models = {"eager": eager}
        for tag in ("main", "hilo"):
            m = prob.build(cls=load_module(args.dir / f"{stem}_{tag}.py").ModelNew, device="cuda")
            m.load_state_dict(eager.state_dict())
            models[tag] = m
        x = prob.inputs(device="cuda")
        with torch.no_grad():
            f64 = prob.build(device="cuda").double()
            f64.load_state_dict(eager.state_dict())
            exact = f64(*[t.double() for t in x])
            for tag, m in models.items():
                print(f"{stem}: {tag}: max abs err vs float64 {(m(*x).double() - exact).abs().max().item():.3g}")
            for r in range(args.rounds):
                row = {tag: time_cuda(lambda m=m: m(*x)) for tag, m in models.items()}
                print(f"{stem} round {r}: " + ", ".join(f"{t} {v.median_ms:.4f} ms ({v.p10_ms:.4f}-{v.p90_ms:.4f})"
                                                        for t, v in row.items()))


if __name__ == "__main__":
    main()
