"""Which forwards a generated ModelNew replays as a CUDA graph (kfuse/kernels/graphs.py), and what it costs or
saves: for each problem, the forward timed as the user calls it (graph where `replay_pays` kept one) and as its
plain launches (`fused_forward`), kfuse.timing.time_cuda (CUDA events, L2 flushed, median of 30).

    PYTHONPATH=src python3 benchmarks/graphs/graph_choice.py PROBLEM...
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from kfuse.bench import graph_replayed
from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module
from kfuse.timing import time_cuda


def main() -> None:
    for arg in sys.argv[1:]:
        prob = load_problem(Path(arg))
        path = Path(tempfile.mkdtemp()) / f"{prob.name}_new.py"
        path.write_text(compile_problem(prob, Options(device="cuda")).source)
        mod = load_module(path)
        model = prob.build(cls=mod.ModelNew, device="cuda")
        inputs = prob.inputs(device="cuda")
        if not hasattr(model, "fused_forward"):
            print(f"{prob.name}: not graphed (a torch fallback op in the forward)")
            continue
        with torch.no_grad():
            called = time_cuda(lambda: model(*inputs))
            launches = time_cuda(lambda: model.fused_forward(*inputs))
        print(f"{prob.name}: graph kept: {graph_replayed(mod, model)}; called {called.median_ms:.4f} ms, "
              f"launches {launches.median_ms:.4f} ms")


if __name__ == "__main__":
    main()
