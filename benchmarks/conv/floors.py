"""Each problem of a `kfuse bench` JSON (KernelBench level 2 conv problems) against two floors on its GPU (H100 SXM or
H200, by the JSON's `gpu`):
three fp16 tensor-core products of the convolutions' flops at the datasheet's dense fp16 rate (kfuse's scheme; TF32
does one at half that rate), and the model's inputs and output moved once at the datasheet's HBM3 bandwidth. Shapes
come from the problem files on the meta device (no kernel runs). Prints a markdown row per problem slower than eager.

    .venv/bin/python benchmarks/conv/floors.py benchmarks/h100-conv.json [../shared/kernelbench/level2]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from kfuse.load import load_problem
from kfuse.modes import primary, variants
from kfuse.optimize import capture_problem
from kfuse.regions.conv_common import TRANSPOSED
from kfuse.regions.kind import numel

# datasheet rates: dense fp16 tensor-core flop/s (the same GH100 chip in both) and HBM bytes/s
RATES = {"H100": (989e12, 3.35e12), "H200": (989e12, 4.8e12)}


def conv_flops(path: Path) -> int:
    """2 x multiply-adds of every convolution in the problem (a transposed one: per input value)."""
    v = primary(variants(capture_problem(load_problem(path), "meta")))
    flops = 0
    for n in v.graph.nodes:
        if n.op == TRANSPOSED:
            flops += 2 * numel(v.graph.shape_of(n.args[0])) * numel(n.args[1].shape) // n.args[1].shape[0]
        elif n.op.startswith("conv"):
            flops += 2 * numel(n.shape) * numel(n.args[1].shape) // n.shape[1]
    return flops


def bytes_moved(path: Path) -> int:
    """fp32 inputs read once and the output written once."""
    prob = load_problem(path)
    with torch.no_grad():
        xs = prob.inputs("meta")
        y = prob.build(device="meta")(*xs)
    return 4 * (sum(x.numel() for x in xs if isinstance(x, torch.Tensor)) + y.numel())


def main(report: str, folder: str = "../shared/kernelbench/level2") -> None:
    print("| problem | eager ms | kfuse ms | vs eager | GFLOP | fp16x3 floor ms | bytes floor ms | kfuse / floor |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rep = json.loads(Path(report).read_text())
    peak, bw = next(rates for gpu, rates in RATES.items() if gpu in rep["gpu"])
    results = rep["results"]
    for r in sorted(results, key=lambda r: r["speedup_vs_eager"]):
        if r["speedup_vs_eager"] >= 1:
            continue
        path = Path(folder) / f"{r['problem']}.py"
        flops = conv_flops(path)
        t_mma, t_mem = 3 * flops / peak * 1e3, bytes_moved(path) / bw * 1e3
        print(f"| {r['problem']} | {r['eager_ms']:.3f} | {r['kfuse_ms']:.3f} | {r['speedup_vs_eager']:.2f}x | "
              f"{flops / 1e9:.1f} | {t_mma:.3f} | {t_mem:.3f} | {r['kfuse_ms'] / max(t_mma, t_mem):.1f}x |")


if __name__ == "__main__":
    main(*sys.argv[1:])
