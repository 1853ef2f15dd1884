"""GPU sweep: the Gluon fp16x3 GEMM (benchmarks/gemm/gluon_proto.py) against the Triton fp16x3p kernel of
kernels/gemm_core.py, problem 12's epilogue (bias, * mult, LeakyReLU), same process, same inputs.

Usage (H100): PYTHONUNBUFFERED=1 python3 benchmarks/gemm/gluon_explore.py --out $OUT/gluon.json
Correctness first (odd shapes, four input ranges, rule 2 and rule 3 against cuBLAS fp32 and float64), then timing
with kfuse.timing.time_cuda (L2 flushed, median of 30). "gemm_ms" times the GEMM kernel with x pre-split, "ms" the
whole forward (split_x + GEMM).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

import gluon_proto as gp  # noqa: E402
from kfuse.kernels import gemm_core as gc  # noqa: E402
from kfuse.timing import time_cuda  # noqa: E402

VARIANTS = {  # name -> (BLOCK_K, STAGES, CHUNK, GROUP_M, WS[, A_REGS])
    "c4": (64, 3, 4, 8, False),
    "c8": (64, 3, 8, 8, False),
    "c16": (64, 3, 16, 8, False),
    "c8_g16": (64, 3, 8, 16, False),
    "k32_c16": (32, 6, 16, 8, False),
    "ws_c8": (64, 3, 8, 8, True),
    "ws_c16": (64, 3, 16, 8, True),
    "ws_k32_c16": (32, 6, 16, 8, True),
    "rs_c8": (64, 3, 8, 8, False, True),
    "ws_rs_c8": (64, 3, 8, 8, True, True),
    "ws_rs_c16": (64, 3, 16, 8, True, True),
}


def gluon_forward(x_parts, w_parts, bias, mult, slope, variant, out=None):
    bk, stages, chunk, group_m, ws, *rest = VARIANTS[variant]
    x_hi, x_lo, x_s = x_parts
    w_hi, w_lo, w_s = w_parts
    M, K = x_hi.shape
    N = w_hi.shape[0]
    kp = gc.padded_k(K)
    if out is None:
        out = torch.empty(M, N, device=x_hi.device, dtype=torch.float32)
    grid = (gc.cdiv(M, 128) * gc.cdiv(N, 128),)
    gp.bias_mul_leakyrelu_kernel[grid](x_hi, x_lo, x_s, w_hi, w_lo, w_s, bias, out, M, N, kp,
                                       x_hi.stride(0), w_hi.stride(0), mult, slope,
                                       BLOCK_M=128, BLOCK_N=128, BLOCK_K=bk, STAGES=stages, CHUNK=chunk,
                                       GROUP_M=group_m, WS=ws, A_REGS=bool(rest and rest[0]), num_warps=8,
                                       maxnreg=168 if ws else None)
    return out


def make_inputs(M, K, N, kind, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(M, K, device="cuda", generator=g) if kind != "randn" else torch.randn(M, K, device="cuda",
                                                                                         generator=g)
    if kind == "1e-6":
        x = x * 1e-6
    elif kind == "1e6":
        x = x * 1e6
    lim = 1 / K ** 0.5
    w = (torch.rand(N, K, device="cuda", generator=g) * 2 - 1) * lim
    b = (torch.rand(N, device="cuda", generator=g) * 2 - 1) * lim
    return x, w, b


def check(out, x, w, b, mult, slope):
    ref = torch.nn.functional.leaky_relu((x.double() @ w.double().t() + b.double()) * mult, slope)
    torch.backends.cuda.matmul.allow_tf32 = False
    eager = torch.nn.functional.leaky_relu((x @ w.t() + b) * mult, slope)
    err = (out.double() - ref).abs().max().item()
    e_err = (eager.double() - ref).abs().max().item()
    scale = max(1.0, ref.abs().max().item() / 10)  # 1e6 inputs: atol follows the output's magnitude
    ok2 = torch.allclose(out, eager, atol=1e-4 * scale, rtol=1e-4)
    ok3 = err <= 2 * e_err + 1e-7
    return {"err": err, "eager_err": e_err, "rule2": bool(ok2), "rule3": bool(ok3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gluon.json")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    gc.ensure_tma_allocator()
    names = args.variants.split(",")
    mult, slope = 2.0, 0.1
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": __import__("triton").__version__, "correctness": [], "timing": []}
    # correctness: odd shapes and the two seed shapes, four input ranges
    shapes = [(37, 70, 129), (257, 300, 200), (1000, 1000, 999), (129, 4100, 520), (1024, 8192, 8192),
              (16384, 4096, 4096)]
    for (M, K, N) in shapes:
        for kind in (["rand", "randn", "1e-6", "1e6"] if M * N * K > 1e9 else ["rand", "randn"]):
            x, w, b = make_inputs(M, K, N, kind, 0)
            wp = gc.split_weight(w)
            xp = gc.split_x(x)
            rows = {"shape": [M, K, N], "kind": kind}
            rows["triton_fp16x3p"] = check(gc.gemm_bias_mul_leakyrelu(x, wp, b, mult, slope, x_parts=xp),
                                           x, w, b, mult, slope)
            for v in names:
                t0 = time.time()
                try:
                    rows[v] = check(gluon_forward(xp, wp, b, mult, slope, v), x, w, b, mult, slope)
                except Exception as e:  # noqa: BLE001
                    rows[v] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                rows[v]["s"] = round(time.time() - t0, 2)
            print(json.dumps(rows), flush=True)
            results["correctness"].append(rows)
    # timing at the two seed shapes
    for (M, K, N) in [(1024, 8192, 8192), (16384, 4096, 4096)]:
        x, w, b = make_inputs(M, K, N, "rand", 1)
        wp = gc.split_weight(w)
        xp = gc.split_x(x)
        out = torch.empty(M, N, device="cuda")
        row = {"shape": [M, K, N]}
        t = time_cuda(lambda: gc.gemm_bias_mul_leakyrelu(x, wp, b, mult, slope, x_parts=xp, out=out))
        row["triton_fp16x3p"] = {"gemm_ms": t.median_ms, "p10": t.p10_ms, "p90": t.p90_ms}
        t = time_cuda(lambda: gc.gemm_bias_mul_leakyrelu(x, wp, b, mult, slope, out=out))
        row["triton_fp16x3p"]["ms"] = t.median_ms
        for v in names:
            try:
                t = time_cuda(lambda: gluon_forward(xp, wp, b, mult, slope, v, out))
                row[v] = {"gemm_ms": t.median_ms, "p10": t.p10_ms, "p90": t.p90_ms}
                t = time_cuda(lambda: gluon_forward(gc.split_x(x), wp, b, mult, slope, v, out))
                row[v]["ms"] = t.median_ms
            except Exception as e:  # noqa: BLE001
                row[v] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        flops = 3 * 2 * M * N * K
        for k, r in row.items():
            if isinstance(r, dict) and "gemm_ms" in r:
                r["tflops_3x"] = round(flops / r["gemm_ms"] / 1e9, 1)
        print(json.dumps(row), flush=True)
        results["timing"].append(row)
    # a second round of the timing, to see the run-to-run spread
    for (M, K, N) in [(1024, 8192, 8192), (16384, 4096, 4096)]:
        x, w, b = make_inputs(M, K, N, "rand", 2)
        wp, xp = gc.split_weight(w), gc.split_x(x)
        out = torch.empty(M, N, device="cuda")
        row = {"shape": [M, K, N], "round": 2}
        row["triton_fp16x3p"] = time_cuda(lambda: gc.gemm_bias_mul_leakyrelu(x, wp, b, mult, slope, x_parts=xp,
                                                                            out=out)).median_ms
        for v in names:
            try:
                row[v] = time_cuda(lambda: gluon_forward(xp, wp, b, mult, slope, v, out)).median_ms
            except Exception as e:  # noqa: BLE001
                row[v] = f"{type(e).__name__}"
        print(json.dumps(row), flush=True)
        results["timing"].append(row)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
