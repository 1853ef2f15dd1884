"""Interleaved A/B of two generated ModelNew files per problem on one GPU: same weights, same inputs.

    python benchmarks/codegen/ab.py A_DIR B_DIR OUT.json PROBLEM.py ...

For each problem: both ModelNew classes are built with the same seed and Model's state dict; the outputs are
checked against float64 eager (max abs error, and eager fp32's own) and against each other; then A and B are timed
in alternation, ROUNDS rounds of kfuse.timing.time_cuda each (L2 flushed, median of CUDA-event times), the first
call of each (compile, tune) outside the timing. The result per problem: each side's median of its round medians.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from kfuse.load import load_problem
from kfuse.timing import time_cuda

ROUNDS = 5


def load_class(path: Path, tag: str) -> type:
    spec = importlib.util.spec_from_file_location(f"ab_{tag}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ModelNew


def build(problem, cls, state) -> torch.nn.Module:
    torch.manual_seed(0)
    model = problem.build(cls=cls, device="cuda")
    model.load_state_dict(state)
    return model


def err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.double() - ref).abs().max().item()


def one(problem_path: str, a_dir: Path, b_dir: Path) -> dict:
    problem = load_problem(problem_path)
    torch.manual_seed(0)
    eager = problem.build(device="cuda")
    state = eager.state_dict()
    models = {tag: build(problem, load_class(d / f"{problem.name}.py", tag), state)
              for tag, d in (("A", a_dir), ("B", b_dir))}
    torch.manual_seed(1)
    inputs = problem.inputs(device="cuda")
    with torch.no_grad():
        ref = problem.build(device="cuda").double()
        ref.load_state_dict(state)
        want = ref(*[x.double() if x.is_floating_point() else x for x in inputs])
        eager_err = err(eager(*inputs), want)
        outs = {tag: m(*inputs) for tag, m in models.items()}
        row = {"problem": problem.name, "eager_fp32_err": eager_err,
               **{f"{tag}_err": err(o, want) for tag, o in outs.items()},
               "a_vs_b": err(outs["A"], outs["B"].double())}
        rounds = {"A": [], "B": []}
        for _ in range(ROUNDS):
            for tag in ("A", "B"):
                rounds[tag].append(time_cuda(lambda m=models[tag]: m(*inputs)).median_ms)
    row.update({f"{tag}_ms": statistics.median(v) for tag, v in rounds.items()},
               **{f"{tag}_rounds_ms": v for tag, v in rounds.items()})
    row["b_over_a"] = row["B_ms"] / row["A_ms"]
    return row


def main(a_dir: str, b_dir: str, out: str, problems: list[str]) -> None:
    rows = []
    for p in problems:
        row = one(p, Path(a_dir), Path(b_dir))
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("rounds_ms")}), flush=True)
        rows.append(row)
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    Path(out).write_text(json.dumps({
        "command": "python benchmarks/codegen/ab.py " + " ".join([a_dir, b_dir, out, *problems]),
        "commit": git, "gpu": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__},
        "rounds": ROUNDS, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
