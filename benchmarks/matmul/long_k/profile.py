"""Where problem 6's time goes (KernelBench level 1, 256 x 256 x 524288): torch.profiler over kfuse's ModelNew,
and each operand-preparation step timed alone. On the GPU machine, from the repository root:

    PYTHONPATH=src python benchmarks/matmul/long_k/profile.py benchmarks/matmul/long_k/p6_fp16x3p.py OUT.json

p6_fp16x3p.py: `kfuse optimize ../shared/kernelbench/level1/6_Matmul_with_large_K_dimension_.py --device cpu
--scheme fp16x3p -o p6_fp16x3p.py` (the file keeps the problem's sizes; the CPU run verified a small instance).
"""

from __future__ import annotations

import importlib.util
import json
import sys

import torch

from kfuse.kernels import gemm_core as gc
from kfuse.kernels import runtime as rt
from kfuse.timing import time_cuda


def load(path: str):
    spec = importlib.util.spec_from_file_location("cand", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(path: str, out: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    mod = load(path)
    torch.manual_seed(0)
    a, b = (t.cuda() for t in mod.get_inputs())
    model = mod.ModelNew(*mod.get_init_inputs()).cuda()
    ref = a.double() @ b.double()
    y = model(a, b)
    rows = {"err_kfuse": float((y.double() - ref).abs().max()),
            "err_eager": float(((a @ b).double() - ref).abs().max())}
    rows["eager_ms"] = time_cuda(lambda: a @ b).median_ms
    rows["kfuse_ms"] = time_cuda(lambda: model(a, b)).median_ms
    bt = b.t()
    rows["bt_contiguous_ms"] = time_cuda(lambda: bt.contiguous()).median_ms
    rows["split_weight_bt_ms"] = time_cuda(lambda: gc.split_weight(bt)).median_ms
    rows["split_x_a_ms"] = time_cuda(lambda: gc.split_x(a)).median_ms
    xs, ws = gc.split_x(a), gc.split_weight(bt)
    K = a.shape[1]
    for cfg in gc.long_k_configs(256, 256, K):
        rows[f"partials_{cfg.short()}_ms"] = time_cuda(lambda: rt.split_k_partials(xs, ws, K, "fp16x3p", cfg)).median_ms
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            model(a, b)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)
    print(table)
    rows["chosen_configs"] = rt.chosen_configs()
    json.dump(rows, open(out, "w"), indent=1)
    for k, v in rows.items():
        print(k, v if not isinstance(v, float) else f"{v:.4g}")


if __name__ == "__main__":
    main(*sys.argv[1:])
