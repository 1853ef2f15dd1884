"""What one correctness call costs inside the worker: the worker's own `call` handler run in this process on a
candidate (no pipe, no sandbox), the three plain calls after the first profiled with cProfile.
Usage: python benchmarks/judge/call_diag.py REF.py CAND.py"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

from kfuse.judge.worker import Worker
from kfuse.load import load_problem
from kfuse.verify import seeded_build, seeded_inputs


def main() -> None:
    ref, cand = sys.argv[1], sys.argv[2]
    problem = load_problem(ref)
    state = {k: v.cpu() for k, v in seeded_build(problem, 1, device="cuda").state_dict().items()}
    w = Worker()
    assert w.load({"path": cand, "device": "cuda", "precision": "fp32"})["ok"]
    assert w.build({"key": "", "seed": 1, "init_inputs": problem.init_inputs(), "state": state})["ok"]
    inputs = [t.cpu() for t in seeded_inputs(problem, 5, device="cuda")]
    req = {"key": "", "seed": 1, "inputs": inputs}
    for label, extra in (("first", {}), ("late", {"late": True}), ("profile", {"profile": True})):
        t0 = time.perf_counter()
        w.call({**req, **extra})
        print(f"{label} call: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(3):
        w.call(req)
    prof.disable()
    print(f"plain call: {(time.perf_counter() - t0) * 1e3 / 3:.1f} ms")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(18)


if __name__ == "__main__":
    main()
