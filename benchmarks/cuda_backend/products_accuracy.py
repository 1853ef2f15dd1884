"""Rule 3's margin of products of two values, kernel by kernel, on a GPU: for each case (a KernelBench level-1 file
and its sizes) the generated ModelNew's error against float64 over eager fp32's own (the contract's verdicts; rule 3
allows 2x + 1e-7) and its median time (CUDA events, 20 calls after 3 warm-ups).
    python3 benchmarks/cuda_backend/products_accuracy.py OUT.json LEVEL1_DIR [--backend cuda|triton] [--scheme S]
The kernel the CUDA backend's fp16x3p runs is picked by the environment: KFUSE_CUDA_SM90=0 keeps the WMMA tile."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module
from kfuse.verify import check_contract, run_in_process

# (file stem, size overrides): the small sizes of tests/test_cuda_products.py, the square product at growing K, and
# the long-K product at full size (K = 524288) and shortened
CASES = [("1_Square_matrix_multiplication_", {"N": n}) for n in (70, 130, 256, 512, 1024, 2048)] + [
    ("10_3D_tensor_matrix_multiplication", {"N": 3, "M": 37, "K": 70, "L": 129}),
    ("16_Matmul_with_transposed_A", {"M": 37, "K": 70, "N": 129}),
    ("18_Matmul_with_transposed_both", {"M": 37, "K": 70, "N": 129}),
    ("17_Matmul_with_transposed_B", {"M": 37, "K": 70, "N": 129}),
    ("6_Matmul_with_large_K_dimension_", {"K": 8192}),
    ("6_Matmul_with_large_K_dimension_", {"K": 65536}),
    ("6_Matmul_with_large_K_dimension_", {}),
]


def median_ms(model, inputs) -> float:
    for _ in range(3):
        model(*inputs)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(*inputs)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def one(level1: Path, stem: str, sizes: dict, opts: Options) -> dict:
    prob = load_problem(level1 / f"{stem}.py", sizes)
    compiled = compile_problem(prob, opts)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(compiled.source)
    module = load_module(Path(f.name))
    report = check_contract(prob, run_in_process(module.ModelNew), device="cuda", trials=3)
    model = module.ModelNew(*prob.init_inputs()).cuda()
    inputs = prob.inputs("cuda")
    ratios = [v.max_abs_err / max(v.ref_max_abs_err, 1e-30) for v in report.verdicts]
    return {"case": stem, "sizes": sizes, "correct": report.correct, "worst_ratio": max(ratios),
            "ratios": ratios, "max_abs_err": report.max_abs_err, "eager_err": report.ref_max_abs_err,
            "ms": median_ms(model, inputs), "failures": report.failures[:2]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("level1", type=Path)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--scheme", default=None)
    ap.add_argument("--only", default="", help="comma-separated case indices")
    args = ap.parse_args()
    opts = Options(device="cuda", backend=args.backend, scheme=args.scheme)
    picked = [CASES[int(i)] for i in args.only.split(",")] if args.only else CASES
    rows = []
    for stem, sizes in picked:
        try:
            row = one(args.level1, stem, sizes, opts)
        except Exception as err:  # a case that fails to build or run is a row, not the end of the sweep
            row = {"case": stem, "sizes": sizes, "error": f"{type(err).__name__}: {err}"[:300]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    label = {"backend": args.backend, "scheme": args.scheme, "sm90": os.environ.get("KFUSE_CUDA_SM90", "1")}
    Path(args.out).write_text(json.dumps({"label": label, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
