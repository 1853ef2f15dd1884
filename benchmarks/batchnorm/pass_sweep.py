"""Problem 39's two memory-bound passes at full size on the GPU, tile shapes interleaved call by call: the
BatchNorm apply (reads y, writes the output: 512 MB) and the split of x (reads x, writes hi/lo: 512 MB).
Each variant's median over `rounds` calls, L2 flushed before each, and its bandwidth.

Usage (GPU): python3 benchmarks/batchnorm/pass_sweep.py [--rounds 60]
"""
import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from kfuse.load import load_problem  # noqa: E402
from kfuse.optimize import Options, compile_problem, load_module  # noqa: E402
from kfuse.timing import L2_FLUSH_BYTES  # noqa: E402

APPLY = [(16, 256, 4), (32, 256, 8), (8, 512, 4), (64, 128, 8), (32, 128, 4), (16, 512, 8)]
SPLIT = [4, 8, 16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args()
    prob = load_problem(Path(__file__).resolve().parents[2] / "problems/seeds/39_gemm_scale_batchnorm.py")
    path = Path(tempfile.mkdtemp()) / "p39.py"
    path.write_text(compile_problem(prob, Options(device="cuda")).source)
    mod = load_module(path)
    M, N = 16384, 4096
    dev = "cuda"
    y = torch.randn(M, N, device=dev)
    out = torch.empty_like(y)
    vec = [torch.rand(N, device=dev) for _ in range(5)]
    x = torch.rand(M, 4096, device=dev)
    parts = torch.empty(M, 2 * 4096, device=dev, dtype=torch.float16)
    scale = torch.empty(M, device=dev)
    runs = {}
    for bm, bn, w in APPLY:
        runs[f"apply_{bm}x{bn}_w{w}"] = (lambda bm=bm, bn=bn, w=w: mod.linear_mul_batch_norm_apply_kernel[
            (mod.cdiv(M, bm), mod.cdiv(N, bn))](y, vec[0], vec[1], out, vec[2], vec[3], vec[4], M, N, FROM_Z=False,
                                                BLOCK_M=bm, BLOCK_N=bn, num_warps=w), 2 * M * N * 4)
    for w in SPLIT:
        runs[f"split_w{w}"] = (lambda w=w: mod.split_rows_kernel[(M,)](x, parts, scale, 4096, 4096, 4096, 1,
                                                                       BLOCK_C=4096, WRITE_PARTS=True,
                                                                       num_warps=w), M * 4096 * 8)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=dev)
    for fn, _ in runs.values():
        fn()
    torch.cuda.synchronize()
    events = {k: [] for k in runs}
    for _ in range(args.rounds):
        for k, (fn, _) in runs.items():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            flush.zero_()
            s.record()
            fn()
            e.record()
            events[k].append((s, e))
    torch.cuda.synchronize()
    rows = {}
    for k, pairs in events.items():
        ms = statistics.median(s.elapsed_time(e) for s, e in pairs)
        rows[k] = {"median_us": round(ms * 1e3, 1), "TB_s": round(runs[k][1] / ms / 1e9, 3)}
        print(k, rows[k])
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
