"""GPU time of the fp32-accurate GEMM core's configs at one small shape (default: problem 33's 1000 x 1000 -> 999),
split modes side by side: presplit x (split_x launch + GEMM), split in the kernel with row_scales, and SPLIT_A=2
(row scales in the kernel too). kfuse.timing.time_cuda (CUDA events, L2 flushed), median of 50.

    PYTHONPATH=src python3 benchmarks/overhead/gemm_configs.py [M K N]
"""
import dataclasses
import sys

import torch

from kfuse.kernels import gemm_core as gc
from kfuse.timing import time_cuda

M, K, N = (int(v) for v in sys.argv[1:4]) if len(sys.argv) >= 4 else (1000, 1000, 999)
x = torch.rand(M, K, device="cuda")
w = torch.rand(N, K, device="cuda") * 2 - 1
b = torch.rand(N, device="cuda")
parts = gc.split_weight(w)
base = [gc.GemmConfig(128, 128, 64, 8, 8, 3), gc.GemmConfig(64, 128, 64, 8, 4, 3), gc.GemmConfig(64, 64, 64, 8, 4, 3)]
for cfg0 in base:
    for split in (False, True, 2):
        cfg = dataclasses.replace(cfg0, split_a=split)
        t = time_cuda(lambda: gc.gemm_bias_mul_leakyrelu(x, parts, b, 2.0, 0.1, "fp16x3p", cfg), runs=50)
        print(f"{M}x{K}->{N} {cfg.short():32s} {t.median_ms * 1e3:8.1f} us")
