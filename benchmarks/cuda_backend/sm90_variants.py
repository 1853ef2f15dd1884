"""Variants of the CUDA backend's Hopper GEMM (gemm_sm90_source.py) on seed 12, timed and checked side by side.

    python3 benchmarks/cuda_backend/sm90_variants.py VARIANT --build-only     # build its extension (run in parallel)
    python3 benchmarks/cuda_backend/sm90_variants.py VARIANT... --json OUT    # then time each, one after the other

A variant is a set of nvcc macros (VARIANTS below) given to seed 12's generated file before its first call (its
CUDA_FLAGS; the extension's name hashes them, so each variant builds once into KFUSE_CACHE_DIR). Per variant:
the ModelNew forward at TIMED sizes timed by triton.testing.do_bench (L2 flushed between
calls, median ms), and at odd sizes the largest error against float64 divided by eager fp32's (rule 3 asks for
at most 2, plus 1e-7 absolute).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from kfuse.load import load_problem  # noqa: E402
from kfuse.optimize import Options, compile_problem, load_module  # noqa: E402

SEED = ROOT / "problems/seeds/12_gemm_multiply_leakyrelu.py"
VARIANTS = {  # the Hopper GEMM's macros (gemm_sm90_source.py); the earlier sweeps' concatenated K is gone
    "split": (),
    "t128c2": ("-DKF_SM90_CLUSTER_N=2",),
    "p1": ("-DKF_SM90_FIXED_PROMOTE=1",),  # K blocks of hi*hi between promotions
    "p2": ("-DKF_SM90_FIXED_PROMOTE=2",),
    "p4": ("-DKF_SM90_FIXED_PROMOTE=4",),
    "wmma": None,  # KFUSE_CUDA_SM90=0: the WMMA tile
}
ODD = [(37, 70, 129), (130, 97, 300), (17, 64, 128), (300, 1000, 999), (64, 4096, 515), (64, 8192, 515),
       (1024, 2048, 1024), (1024, 4096, 4096), (1024, 8192, 8192), (4096, 4096, 4096)]
TIMED = [(1024, 8192, 8192), (16384, 4096, 4096)]


def module_for(variant: str, tmp: Path):
    """Seed 12's generated file as a module, its CUDA flags set for `variant`."""
    import os

    os.environ["KFUSE_CUDA_SM90"] = "0" if VARIANTS[variant] is None else "1"
    source = compile_problem(load_problem(SEED, {}), Options(device="cpu", backend="cuda")).source
    path = tmp / f"seed12_{variant}.py"
    path.write_text(source)
    module = load_module(path)
    module.CUDA_FLAGS = ("-O3", *(VARIANTS[variant] or ()))
    return module


def build(module, sizes: tuple[int, int, int] = (37, 70, 129)):
    """(problem, ModelNew on the GPU) at these sizes; the first forward builds or loads the extension."""
    m, k, n = sizes
    prob = load_problem(SEED, {"batch_size": m, "in_features": k, "out_features": n})
    torch.manual_seed(0)
    model = prob.build(cls=module.ModelNew, device="cuda")
    return prob, model


def error_ratio(module, sizes) -> float:
    """max |kfuse - float64| / max |eager fp32 - float64| over 3 draws."""
    prob, model = build(module, sizes)
    worst = 0.0
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.rand(sizes[0], sizes[1], device="cuda")
        with torch.no_grad():
            w, b = model.gemm.weight.double(), model.gemm.bias.double()
            ref = torch.nn.functional.leaky_relu((x.double() @ w.t() + b) * 2.0, 0.1)
            torch.backends.cuda.matmul.allow_tf32 = False
            eager = torch.nn.functional.leaky_relu((x @ model.gemm.weight.t() + model.gemm.bias) * 2.0, 0.1)
            got = model(x)
        e_k = float((got.double() - ref).abs().max())
        e_e = float((eager.double() - ref).abs().max())
        worst = max(worst, (e_k - 1e-7) / e_e)
    return worst


def measure(variant: str, tmp: Path) -> dict:
    from triton.testing import do_bench

    module = module_for(variant, tmp)
    times = {}
    for m, k, n in TIMED:
        _, model = build(module, (m, k, n))
        x = torch.rand(m, k, device="cuda")
        with torch.no_grad():
            model(x)
            times[f"{m}x{k}->{n}"] = round(do_bench(lambda: model(x), warmup=25, rep=300), 4)  # noqa: B023
    ratios = {f"{m}x{k}->{n}": round(error_ratio(module, (m, k, n)), 3) for m, k, n in ODD}
    return {"variant": variant, "flags": list(VARIANTS[variant]) if VARIANTS[variant] is not None
            else ["KFUSE_CUDA_SM90=0"], "ms": times, "worst_error_over_eager": max(ratios.values()),
            "error_over_eager": ratios}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", choices=sorted(VARIANTS))
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tmp", type=Path, default=Path("/tmp"))
    args = ap.parse_args()
    if args.build_only:
        for v in args.variants:
            build(module_for(v, args.tmp))[1](torch.rand(37, 70, device="cuda"))
        return
    rows = []
    for v in args.variants:
        row = measure(v, args.tmp)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "results": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
