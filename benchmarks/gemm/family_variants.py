"""Side by side, in one process on one GPU: two generated forwards of one problem, same state and inputs,
timed in alternating rounds (kfuse.timing.time_cuda: L2 flushed, >= 30 runs each).

  dropout: problem 41 in eval mode. `forward` (the eval forward: Dropout gone, the `* 2` fused into the
           softmax's apply pass) against `forward_train` called in eval mode, which is the forward kfuse made
           before the eval forward existed (Dropout an identity torch call, then a torch `* 2` pass over M x N).
  groups:  problem 43 (910 groups of 9). Phase 2 from y (NARROW_SLOTS = 2, the default) against the partial
           slots in phase 1 (NARROW_SLOTS huge: 16 masked reductions per 128-wide tile), each generated anew.

    PYTHONPATH=src python3 benchmarks/gemm/family_variants.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module
from kfuse.regions import gemm_groupnorm_wide
from kfuse.timing import time_cuda

GEMM = Path(__file__).resolve().parents[2] / "problems" / "gemm"


def build(path: Path, narrow_slots: int = gemm_groupnorm_wide.NARROW_SLOTS):
    prob = load_problem(path)
    saved, gemm_groupnorm_wide.NARROW_SLOTS = gemm_groupnorm_wide.NARROW_SLOTS, narrow_slots
    try:
        source = compile_problem(prob, Options(device="cuda")).source
    finally:
        gemm_groupnorm_wide.NARROW_SLOTS = saved
    out = Path(tempfile.mkdtemp()) / f"{prob.name}_{narrow_slots}.py"
    out.write_text(source)
    torch.manual_seed(0)
    eager = prob.build(device="cuda")
    new = prob.build(cls=load_module(out).ModelNew, device="cuda")
    new.load_state_dict(eager.state_dict())
    return prob, eager, new


def compare(label: str, fns: dict, ref: torch.Tensor, rounds: int) -> None:
    with torch.no_grad():
        for name, fn in fns.items():
            err = (fn().double() - ref.double()).abs().max().item()
            print(f"{label}: {name}: max abs diff vs eager {err:.3g}")
        for r in range(rounds):
            row = {name: time_cuda(fn) for name, fn in fns.items()}
            print(f"{label} round {r}: " + ", ".join(f"{n} {t.median_ms:.4f} ms (p10-p90 {t.p10_ms:.4f}-{t.p90_ms:.4f})"
                                                      for n, t in row.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    prob, eager, new = build(GEMM / "41_gemm_softmax_dropout_eval.py")
    x = prob.inputs(device="cuda")
    with torch.no_grad():
        ref = eager(*x)
    assert not new.dropout.training
    compare("dropout", {"eager": lambda: eager(*x), "eval forward (fused)": lambda: new(*x),
                        "before: forward_train in eval mode": lambda: new.forward_train(*x)}, ref, args.rounds)
    prob, eager, new = build(GEMM / "43_gemm_groupnorm_narrow_tanh.py")
    _, _, slots = build(GEMM / "43_gemm_groupnorm_narrow_tanh.py", narrow_slots=10**9)
    x = prob.inputs(device="cuda")
    with torch.no_grad():
        ref = eager(*x)
    compare("groups", {"eager": lambda: eager(*x), "phase 2 from y": lambda: new(*x),
                       "before: partial slots": lambda: slots(*x)}, ref, args.rounds)


if __name__ == "__main__":
    main()
