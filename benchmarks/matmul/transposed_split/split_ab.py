"""The transposed split against torch's transposed copy plus the row split, per shape of B (K, N) row-major, on a GPU:

    PYTHONPATH=src python benchmarks/matmul/transposed_split/split_ab.py OUT.json

Both give the same bits (tests/test_gemm_core.py); this times them in alternation (kfuse.timing.time_cuda, 5 rounds
each, L2 flushed), so the product path can take the faster one per shape.
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from kfuse.kernels import gemm_core as gc
from kfuse.timing import time_cuda

SHAPES = [(2048, 768), (4096, 4096), (8192, 4096), (1024, 2048), (524288, 256), (2048, 8192)]


def main(out: str) -> None:
    rows = []
    for K, N in SHAPES:
        b = torch.randn(K, N, device="cuda")
        bt = b.t()
        ways = {"copy_then_rows": lambda: gc.split_weight(bt.contiguous()), "tiled": lambda: gc.split_transposed(bt)}
        times = {k: [] for k in ways}
        for _ in range(5):
            for k, f in ways.items():
                times[k].append(time_cuda(f).median_ms)
        row = {"K": K, "N": N, **{k: statistics.median(v) for k, v in times.items()}}
        print(json.dumps(row), flush=True)
        rows.append(row)
    json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
