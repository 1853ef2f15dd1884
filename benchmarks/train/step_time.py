"""A training step (grads to None, forward, backward for a fixed upstream gradient), eager fp32 against the
generated ModelNew, kfuse.timing.time_cuda (CUDA events, L2 flushed, median of 30): `kfuse bench --train`'s
method without the torch.compile baselines, for a quick check of one backward change.

    PYTHONPATH=src python3 benchmarks/train/step_time.py PROBLEM...
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from kfuse.bench import load_kfuse, step_fn, upstream_grads
from kfuse.load import load_problem
from kfuse.timing import time_cuda


def main() -> None:
    for arg in sys.argv[1:]:
        prob = load_problem(Path(arg))
        module = load_kfuse(prob, "cuda", Path(tempfile.mkdtemp()))
        torch.manual_seed(0)
        eager = prob.build(device="cuda")
        fused = prob.build(cls=module.ModelNew, device="cuda")
        fused.load_state_dict(eager.state_dict())
        inputs = prob.inputs(device="cuda")
        ups = upstream_grads(eager, inputs)
        times = {name: time_cuda(step_fn(m, inputs, ups)) for name, m in (("eager", eager), ("kfuse", fused))}
        e, k = times["eager"].median_ms, times["kfuse"].median_ms
        print(f"{prob.name}: training step eager {e:.3f} ms, kfuse {k:.3f} ms, {e / k:.2f}x")


if __name__ == "__main__":
    main()
