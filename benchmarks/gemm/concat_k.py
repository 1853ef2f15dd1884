"""Experiment: fp16x3 with the three products laid out along K ("k3"), so that ONE tensor-core dot
per K block computes lo*hi + hi*lo + hi*hi into a fresh partial, promoted into the fp32 sum with an FADD.

Why: fp16x3p (gemm_core) issues three dots per K block and Triton 3.6 waits for every wgmma group after each dot
(NOTES.md, "Bigger tiles for fp16x3p"): 3 drains per 12 wgmma instructions at BLOCK_K=64. Laying the parts out as,
per 64-wide K segment, A3 = [lo | hi | hi] and B3 = [hi | lo | hi] makes the three products one plain GEMM over
K3 = 3 K; a BLOCK_K3 = 128 dot is 8 wgmma instructions per drain (2x fewer drains), same partial length as fp16x3p.
Cost: A3 and B3 are 6 B per element instead of 4 (more L2 -> smem traffic, a larger split).

GPU:  PYTHONPATH=src python3 benchmarks/gemm/concat_k.py [--only p12|p39]   (prints a table, writes $OUT/concat_k.json)
CPU:  TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/gemm/concat_k.py --cpu   (37x70 -> 129 vs float64)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--cpu", action="store_true")
ap.add_argument("--only", default="")
ap.add_argument("--reps", type=int, default=30)
ap.add_argument("--set", type=int, default=1, help="1: first sweep; 2: the lagged-partial (MODE 2) TMA configs")
args = ap.parse_args()
if args.cpu:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kfuse.kernels import gemm_core as gc  # noqa: E402
from kfuse.timing import time_cuda  # noqa: E402

SEG = 64  # K segment of each part in the k3 layout (= gc.PAD_K, so 3 * padded K is a multiple of 3 * SEG)


def k3_layout(parts_hi: torch.Tensor, parts_lo: torch.Tensor, order: str) -> torch.Tensor:
    """(R, KP) hi and lo (views of split_x / split_weight parts, rows zero-padded to KP) -> (R, 3 KP) fp16 with each
    SEG-wide K segment written three times: order "a" = [lo, hi, hi], "b" = [hi, lo, hi]."""
    R = parts_hi.shape[0]
    KP = parts_hi.stride(0) // 2  # the parts' padded row (split_* lay hi and lo side by side, each KP wide)
    base = parts_hi.as_strided((R, 2 * KP), (2 * KP, 1))
    hi = base[:, :KP].reshape(R, KP // SEG, SEG)
    lo = base[:, KP:].reshape(R, KP // SEG, SEG)
    trio = (lo, hi, hi) if order == "a" else (hi, lo, hi)
    return torch.stack(trio, dim=2).reshape(R, 3 * KP).contiguous()


@triton.jit
def k3_kernel(a_ptr, a_s_ptr, b_ptr, b_s_ptr, bias_ptr, out_ptr, M, N, K3, stride_a, stride_b, stride_o,
              mult, slope, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              GROUP_M: tl.constexpr, MODE: tl.constexpr, TMA: tl.constexpr):
    """MODE 0: one loop-carried tensor-core accumulator (fast, NOT fp32-accurate: the reference for speed);
    1: fresh partial per K block + FADD; 2: the same, the partial added one iteration late (to see whether Triton
    then keeps the wgmma in flight)."""
    pid_m, pid_n = gc._tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    am = offs_m % M
    bn = offs_n % N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K3], strides=[stride_a, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K3], strides=[stride_b, 1], block_shape=[BLOCK_N, BLOCK_K])
    a_ptrs = a_ptr + am[:, None].to(tl.int64) * stride_a + offs_k[None, :]
    b_ptrs = b_ptr + bn[None, :].to(tl.int64) * stride_b + offs_k[:, None]
    for kb in range(0, K3 // BLOCK_K):
        if TMA:
            a = a_desc.load([pid_m * BLOCK_M, kb * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, kb * BLOCK_K]).T
        else:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        if MODE == 0:
            acc = tl.dot(a, b, acc)
        elif MODE == 1:
            acc += tl.dot(a, b)
        else:
            acc += part
            part = tl.dot(a, b)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if MODE == 2:
        acc += part
    a_s = tl.load(a_s_ptr + am)
    b_s = tl.load(b_s_ptr + bn)
    acc = acc * gc._pow2_inv(a_s)[:, None] * gc._pow2_inv(b_s)[None, :]
    bias = tl.load(bias_ptr + bn)
    y = (acc + bias[None, :]) * mult
    y = tl.where(y >= 0, y, y * slope)
    o = out_ptr + offs_m[:, None].to(tl.int64) * stride_o + offs_n[None, :]
    tl.store(o, y, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def k3_gemm(a3, a_s, b3, b_s, bias, mult, slope, cfg, out=None):
    bm, bn, bk, g, w, s, mode, tma, maxnreg = cfg
    M, K3 = a3.shape
    N = b3.shape[0]
    assert K3 % bk == 0 and b3.shape[1] == K3
    if out is None:
        out = torch.empty(M, N, device=a3.device, dtype=torch.float32)
    if tma:
        gc.ensure_tma_allocator()
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    grid = (gc.cdiv(M, bm) * gc.cdiv(N, bn),)
    k3_kernel[grid](a3, a_s, b3, b_s, bias, out, M, N, K3, a3.stride(0), b3.stride(0), out.stride(0),
                    float(mult), float(slope), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=g, MODE=mode, TMA=tma,
                    num_warps=w, num_stages=s, **extra)
    return out


def name(cfg) -> str:
    bm, bn, bk, g, w, s, mode, tma, maxnreg = cfg
    return (f"k3m{mode}_{bm}x{bn}x{bk}_g{g}_w{w}_s{s}" + ("_tma" if tma else "") +
            (f"_r{maxnreg}" if maxnreg else ""))


def prepare(x, w):
    xh, xl, xs = gc.split_x(x)
    wh, wl, ws = gc.split_weight(w)
    KP3 = 3 * gc.padded_k(x.shape[1])
    a3, b3 = k3_layout(xh, xl, "a"), k3_layout(wh, wl, "b")
    pad = (-KP3) % 256  # any BLOCK_K3 up to 256 runs unmasked over zero columns
    if pad:
        a3 = torch.nn.functional.pad(a3, (0, pad))
        b3 = torch.nn.functional.pad(b3, (0, pad))
    return a3, xs, b3, ws, (xh, xl, xs), (wh, wl, ws)


def cpu_main() -> int:
    torch.manual_seed(0)
    M, K, N = 37, 70, 129
    x, w, b = torch.rand(M, K), torch.rand(N, K) - 0.5, torch.rand(N) - 0.5
    ref = gc.gemm_bias_mul_leakyrelu_ref(x.double(), w.double(), b.double(), 2.0, 0.1)
    eager = gc.gemm_bias_mul_leakyrelu_ref(x, w, b, 2.0, 0.1)
    a3, xs, b3, ws, _, _ = prepare(x, w)
    ok = True
    for cfg in [(16, 32, 64, 2, 4, 2, 1, False, 0), (32, 64, 128, 2, 4, 2, 2, False, 0)]:
        out = k3_gemm(a3, xs, b3, ws, b, 2.0, 0.1, cfg)
        err, e_err = (out.double() - ref).abs().max().item(), (eager.double() - ref).abs().max().item()
        good = err <= 2 * e_err + 1e-7
        ok &= good
        print(f"{name(cfg)}: err {err:.2e} (eager {e_err:.2e}) {'pass' if good else 'FAIL'}")
    return 0 if ok else 1


def gpu_main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    print(res["device"], res["torch"], res["triton"], flush=True)

    def bench(fn) -> float:  # kfuse's timing (CUDA events, L2 flushed before each run), median ms
        return time_cuda(fn, runs=args.reps).median_ms

    C = (128, 128, 128, 8, 8, 3, 1, False, 0)
    variants = [
        (128, 128, 64, 8, 8, 4, 1, False, 0), (128, 128, 64, 8, 8, 5, 1, False, 0),
        (128, 128, 128, 8, 8, 2, 1, False, 0), C, (128, 128, 128, 16, 8, 3, 1, False, 0),
        (128, 128, 128, 8, 8, 3, 1, True, 0), (128, 128, 64, 8, 8, 4, 1, True, 0),
        (128, 128, 64, 8, 8, 3, 1, True, 128), (128, 128, 64, 8, 8, 3, 1, False, 128),
        (128, 128, 128, 8, 8, 3, 2, False, 0), (128, 128, 128, 8, 8, 3, 2, True, 0),
        (64, 128, 128, 8, 4, 3, 1, False, 0), (64, 256, 64, 8, 4, 3, 1, False, 0),
        (128, 256, 64, 8, 8, 3, 1, False, 0),
        (128, 256, 64, 8, 8, 3, 0, False, 0), (128, 128, 128, 8, 8, 3, 0, False, 0),
    ]
    if args.set == 2:
        variants = [(128, 128, 64, 8, 8, 4, 2, True, 0), (128, 128, 64, 8, 8, 5, 2, True, 0),
                    (128, 128, 64, 16, 8, 4, 2, True, 0), (128, 128, 128, 8, 8, 3, 2, True, 0)]
        C = variants[0]
    shapes = [("p12", 1024, 8192, 8192, 2.0, 0.1), ("p39", 16384, 4096, 4096, 1.0, 1.0)]
    for pname, M, K, N, mult, slope in shapes:
        if args.only and pname != args.only:
            continue
        g = torch.Generator(device=dev).manual_seed(0)
        bound = 1 / K ** 0.5
        x = torch.rand(M, K, device=dev, generator=g)
        w = torch.empty(N, K, device=dev).uniform_(-bound, bound, generator=g)
        b = torch.empty(N, device=dev).uniform_(-bound, bound, generator=g)
        ref = gc.gemm_bias_mul_leakyrelu_ref(x.double(), w.double(), b.double(), mult, slope)
        eager = gc.gemm_bias_mul_leakyrelu_ref(x, w, b, mult, slope)
        e_err = (eager.double() - ref).abs().max().item()
        a3, xs, b3, ws, xp, wp = prepare(x, w)

        def check(out):
            err = (out.double() - ref).abs().max().item()
            close = bool(torch.allclose(out, eager, atol=1e-4, rtol=1e-4))
            return err, bool(err <= 2 * e_err + 1e-7 and close)

        base_cfg = gc.default_config(M, N, K, "fp16x3p")
        out = gc.gemm_bias_mul_leakyrelu(x, wp, b, mult, slope, "fp16x3p", base_cfg, x_parts=xp)
        err, ok = check(out)
        t = bench(lambda: gc.gemm_bias_mul_leakyrelu(x, wp, b, mult, slope, "fp16x3p", base_cfg, x_parts=xp))
        t_split = bench(lambda: gc.split_x(x))
        row = dict(problem=pname, variant="fp16x3p " + base_cfg.short(), gemm_ms=t, err=err, eager_err=e_err,
                   passed=ok, split_x_ms=t_split)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
        for cfg in variants:
            row = dict(problem=pname, variant=name(cfg))
            try:
                t0 = time.time()
                out = k3_gemm(a3, xs, b3, ws, b, mult, slope, cfg)
                torch.cuda.synchronize()
                row["compile_s"] = round(time.time() - t0, 1)
                row["err"], row["passed"] = check(out)
                row["eager_err"] = e_err
                row["gemm_ms"] = bench(lambda: k3_gemm(a3, xs, b3, ws, b, mult, slope, cfg))
                row["tflops_3products"] = 6 * M * N * K / row["gemm_ms"] / 1e9
            except Exception as e:  # out of resources, unsupported options: record and go on
                row["error"] = repr(e)[:200]
                torch.cuda.synchronize()
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
        if pname == "p12":  # range safety of the k3 scheme (same products, so expected as fp16x3p)
            for kind in ("randn", "rand*1e6", "rand*1e-6"):
                xx = torch.randn(M, K, device=dev, generator=g) if kind == "randn" else \
                    torch.rand(M, K, device=dev, generator=g) * (1e6 if kind == "rand*1e6" else 1e-6)
                r2 = gc.gemm_bias_mul_leakyrelu_ref(xx.double(), w.double(), b.double(), mult, slope)
                e2 = gc.gemm_bias_mul_leakyrelu_ref(xx, w, b, mult, slope)
                ee = (e2.double() - r2).abs().max().item()
                aa, ss, _, _, _, _ = prepare(xx, w)
                o2 = k3_gemm(aa, ss, b3, ws, b, mult, slope, C)
                er = (o2.double() - r2).abs().max().item()
                atol = 1e-4 * max(1.0, r2.abs().max().item() / 10.0)
                row = dict(problem=pname, variant=name(C) + " " + kind, err=er, eager_err=ee,
                           passed=bool(er <= 2 * ee + 1e-7 and torch.allclose(o2, e2, atol=atol, rtol=1e-4)))
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
        x = w = b = ref = eager = a3 = b3 = xp = wp = None  # free this shape's tensors (the closures above are done)
        torch.cuda.empty_cache()
    print(f"\n{'prob':5}{'variant':44}{'ms':>8}{'TF/s':>7}{'err':>10}{'eager':>10}  pass")
    for r in res["rows"]:
        if "error" in r:
            print(f"{r['problem']:5}{r['variant']:44} ERROR {r['error'][:70]}")
        else:
            print(f"{r['problem']:5}{r['variant']:44}{r.get('gemm_ms', float('nan')):8.3f}"
                  f"{r.get('tflops_3products', float('nan')):7.0f}{r['err']:10.2e}{r['eager_err']:10.2e}"
                  f"  {r['passed']}")
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "concat_k.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    if args.cpu:
        sys.exit(cpu_main())
    gpu_main()
