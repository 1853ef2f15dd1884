"""The convolution tile alone on a GPU: each KernelBench file's first convolution at full size, timed per tile config,
with the packing pass timed apart, against cuDNN as users run it (TF32) and strict fp32, and checked against float64.

    python3 benchmarks/conv/packed_bench.py OUT.json FILE...

For each file: its model's first nn.Conv1d/2d/3d (not transposed) and the model's input shape (the convolution must
be the model's first op). Per config of `configs()`: the whole conv_forward (scales, packing, tile kernel, output) and
the tile kernel alone on pre-packed operands (triton.testing.do_bench: L2 flushed, median of its repetitions); the
max abs error against a float64 convolution (sample 0..min(N, 8) only, to bound the float64 work), beside TF32's
and strict fp32's. One JSON record per file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from kfuse.kernels import conv as cv
from kfuse.kernels import conv_config as cc
from kfuse.load import load_problem


def first_conv(path: Path) -> tuple[torch.nn.Module, torch.Tensor]:
    prob = load_problem(path)
    torch.manual_seed(0)
    model = prob.build(device="cuda")
    conv = next(m for m in model.modules() if type(m) in (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d))
    return conv, prob.inputs("cuda")[0]


def configs(geo: cv.ConvGeometry) -> list[cc.ConvConfig]:
    default = cc.conv_config(geo, "fp16x3p", False)
    bn = default.block_n
    out = [default]
    few = os.environ.get("PACKED_CONFIGS") == "few"  # the default, the 8-warp 128 x 128 x 64 and the Gluon tile's
    tiles = ((128, bn, 32, 8, 3), (64, bn, 32, 8, 3), (128, bn, 16, 8, 4), (128, min(bn, 64), 32, 4, 3),
             (64, min(bn, 64), 32, 4, 4), (64, bn, 64, 4, 3), (128, bn, 64, 8, 3))
    for m, n, k, w, s in tiles[-1:] if few else tiles:
        cfg = cc.ConvConfig(m, n, cc.k_block(geo, k), w, s)
        if cfg not in out:
            out.append(cfg)
    if cv.wide_ok(torch.empty(0, device="cuda"), geo, "fp16x3p"):  # the Gluon tile (kernels/conv_sm90.py)
        out += cc.conv_candidates(geo, cc.sm90_config(geo), "fp16x3p")
    return out


def operands(x, w, args, cfg):
    """conv_plan's operands for cfg: wide rows (the padded pack) for an sm90 config."""
    cv.SM90_ON = cfg.sm90
    return cv.conv_plan(x, w, *args)


def bench_file(path: Path) -> dict:
    conv, x = first_conv(path)
    w, b = conv.weight, conv.bias
    args = (conv.stride, conv.padding, conv.dilation, conv.groups)
    geo = cv.conv_geometry(tuple(x.shape), tuple(w.shape), *args)
    flops = 2 * geo.M * geo.C_out * geo.K
    rec = {"file": path.name, "geometry": dataclasses.asdict(geo), "gflop": flops / 1e9}
    with torch.no_grad():
        k = min(x.shape[0], 8)
        ref = cv.conv_ref(x[:k].double(), w.double(), b.double() if b is not None else None, *args)
        torch.backends.cudnn.allow_tf32 = True
        eager = lambda: cv.conv_ref(x, w, b, *args)  # noqa: E731
        rec["eager_tf32_ms"] = do_bench(eager)
        rec["eager_tf32_err"] = (eager()[:k].double() - ref).abs().max().item()
        torch.backends.cudnn.allow_tf32 = False
        rec["eager_strict_ms"] = do_bench(eager)
        rec["eager_strict_err"] = (eager()[:k].double() - ref).abs().max().item()
        torch.backends.cudnn.allow_tf32 = True
        rec["pack_ms"] = do_bench(lambda: cv.pack_input(x, geo.groups, True))
        rec["pack_wide_ms"] = do_bench(lambda: cv.pack_input(x, geo.groups, True, geo.wide_pad()))
        out = torch.empty(geo.out_shape, device=x.device)
        rec["configs"] = []
        for cfg in configs(geo):
            row = {"config": cfg.short()}
            try:
                _, scheme, _, ops, sizes = operands(x, w, args, cfg)
                t0 = time.perf_counter()
                y = cv.conv_forward(x, w, b, *args, cfg=cfg)
                torch.cuda.synchronize()
                row["first_call_s"] = round(time.perf_counter() - t0, 2)
                row["err"] = (y[:k].double() - ref).abs().max().item()
                row["total_ms"] = do_bench(lambda: cv.conv_forward(x, w, b, *args, cfg=cfg))

                def kernel_only():
                    cc.pick_conv(cv.conv_bias_kernel, cv.conv_bias_kernel_sm90, cfg)[cc.conv_grid(geo, cfg)](
                        *ops, b if b is not None else out, out, *sizes, HAS_BIAS=b is not None, BLOCK_M=cfg.block_m,
                        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SCHEME=scheme, DENSE=geo.dense,
                        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **cc.conv_options(cfg))
                row["kernel_ms"] = do_bench(kernel_only)
                row["kernel_tflops_fp16"] = round(3 * flops / row["kernel_ms"] / 1e9, 1)
            except Exception as e:  # a config that does not compile or run: recorded, the others go on
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rec["configs"].append(row)
            print(path.name, row, flush=True)
    return rec


def main(out: str, files: list[str]) -> None:
    records = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "results": []}
    for f in files:
        rec = bench_file(Path(f))
        records["results"].append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k not in ("configs", "geometry")}), flush=True)
        Path(out).write_text(json.dumps(records, indent=1))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
