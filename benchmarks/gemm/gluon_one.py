"""Run one Gluon GEMM variant at one shape a few times (for ncu): python3 gluon_one.py VARIANT M K N"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
import gluon_explore as ge  # noqa: E402
from kfuse.kernels import gemm_core as gc  # noqa: E402

v, M, K, N = sys.argv[1], *map(int, sys.argv[2:5])
gc.ensure_tma_allocator()
x, w, b = ge.make_inputs(M, K, N, "rand", 0)
wp, xp = gc.split_weight(w), gc.split_x(x)
for _ in range(3):
    if v == "triton":
        gc.gemm_bias_mul_leakyrelu(x, wp, b, 2.0, 0.1, x_parts=xp)
    else:
        ge.gluon_forward(xp, wp, b, 2.0, 0.1, v)
torch.cuda.synchronize()
