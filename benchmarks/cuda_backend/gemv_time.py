"""Time the CUDA backend's GEMV kernel (kf_gemv_kernel: GEMMs of at most 16 rows) against W's bandwidth floor and
eager, on problems/gemm/37 (Linear 8192 -> 8192, softplus, hardswish):

    PYTHONPATH=src python3 benchmarks/cuda_backend/gemv_time.py [--json PATH]

Per case (rows M, K): the region's launcher `<Fn>.launch` (what ModelNew.forward runs: operands, the kernel, the
epilogue fused) and eager (the Model's forward: cuBLAS + two pointwise kernels, TF32 off) called back to back,
the median over 5 rounds of 20 calls between two CUDA events (W is 268 MB, far over the L2, so every call reads it
from memory), microseconds per call; GB/s is W's bytes over that time. `predicted_us` is W's bytes at 3 TB/s
(what an H100's HBM3 sustains) plus 3 us; `vs_prediction` the ratio. K = 8191 runs the single-float pieces (K odd).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "problems" / "gemm" / "37_gemm_softplus_hardswish_batch1.py"
CASES = [(1, 8192), (4, 8192), (16, 8192), (1, 8191)]
BANDWIDTH = 3.0e12  # bytes/s, the prediction's
OVERHEAD_US = 3.0  # launch and x's staging, the prediction's


def per_call_us(fn, rounds: int = 5, calls: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from kfuse.load import load_problem
    from kfuse.optimize import Options, compile_problem, load_module

    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    module = None
    print(f"{torch.cuda.get_device_name()}: kf_gemv_kernel on {PROBLEM.name}")
    print(f"{'M':>3} {'K=N':>5} {'kernel us':>10} {'GB/s':>7} {'eager us':>9} {'eager/cuda':>10} {'predicted us':>13} "
          f"{'vs pred':>8}")
    for m, k in CASES:
        prob = load_problem(PROBLEM, {"batch_size": m, "in_features": k, "out_features": k})
        if module is None:  # one file for every case: the CUDA source does not depend on the sizes
            compiled = compile_problem(prob, Options(device="cuda", backend="cuda"))
            out = Path(tempfile.gettempdir()) / f"kfuse_gemv_time_{os.getpid()}.py"
            out.write_text(compiled.source)
            module = load_module(out)
        (fn,) = [v for n, v in vars(module).items() if n.endswith("Fn") and isinstance(v, type)
                 and issubclass(v, module.CudaGemmFn) and v is not module.CudaGemmFn]
        torch.manual_seed(0)
        model = prob.build(cls=module.ModelNew, device="cuda")
        eager = prob.build(device="cuda")
        eager.load_state_dict(model.state_dict())
        x = torch.rand(m, k, device="cuda")
        with torch.no_grad():
            err = float((fn.launch(model, x) - eager(x)).abs().max())
            cuda_us = per_call_us(lambda: fn.launch(model, x))
            eager_us = per_call_us(lambda: eager(x))
        w_bytes = k * k * 4
        predicted = w_bytes / BANDWIDTH * 1e6 + OVERHEAD_US
        row = {"M": m, "K": k, "N": k, "cuda_us": round(cuda_us, 2), "GBps": round(w_bytes / cuda_us / 1e3, 1),
               "eager_us": round(eager_us, 2), "eager_over_cuda": round(eager_us / cuda_us, 3),
               "predicted_us": round(predicted, 1), "vs_prediction": round(cuda_us / predicted, 3),
               "max_abs_diff_vs_eager": err}
        rows.append(row)
        print(f"{m:>3} {k:>5} {cuda_us:>10.1f} {row['GBps']:>7.0f} {eager_us:>9.1f} {row['eager_over_cuda']:>10.2f} "
              f"{predicted:>13.1f} {row['vs_prediction']:>8.2f}")
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
