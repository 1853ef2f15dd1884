"""Where the direct tile beats the padded implicit GEMM: a grid of channel counts, not any one problem's shape.

    python3 benchmarks/conv/direct_grid.py OUT.json

For input channels a group CIN_G in (3, 4, 6, 8, 12, 16) and output channels COUT_G in (8, 16, 32, 64, 128), a 3 x 3
Conv2d (batch 32, 128 x 128) and a 3 x 3 x 3 Conv3d (batch 16, 16 x 32 x 32), both with bias: `conv_forward` timed
(triton.testing.do_bench, median) under "fp16x3p" (the padded tile) and "direct32" at their default configs (no
tuning: the kinds without a tuner run these). One JSON row per geometry with both times and their ratio; a table on
stdout. The rule in kernels/conv_geometry.py (direct_k) is read off this grid.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton

from kfuse.kernels import conv as cv

SHAPES = {"2d": ((32, 128, 128), (3, 3)), "3d": ((16, 16, 32, 32), (3, 3, 3))}
CIN = (3, 4, 6, 8, 12, 16)
COUT = (8, 16, 32, 64, 128)


def time_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median"))


def main(argv: list[str]) -> int:
    target = Path(argv[0])
    rows = []
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    print("dims | CIN_G | COUT_G | padded ms | direct32 ms | direct / padded")
    for dims, ((n, *spatial), kernel) in SHAPES.items():
        for cin in CIN:
            x = torch.randn(n, cin, *spatial, device="cuda")
            for cout in COUT:
                w = torch.randn(cout, cin, *kernel, device="cuda") / (cin * 9) ** 0.5
                b = torch.randn(cout, device="cuda")
                times = {s: time_ms(lambda s=s: cv.conv_forward(x, w, b, scheme=s)) for s in ("fp16x3p", "direct32")}
                row = {"dims": dims, "cin_g": cin, "cout_g": cout, "padded_ms": times["fp16x3p"],
                       "direct32_ms": times["direct32"], "ratio": times["direct32"] / times["fp16x3p"]}
                rows.append(row)
                print(f"{dims} | {cin} | {cout} | {row['padded_ms']:.3f} | {row['direct32_ms']:.3f} | "
                      f"{row['ratio']:.2f}", flush=True)
            target.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
