"""The transposed convolution's tile configs, convolution alone, at full size.

    python3 benchmarks/conv/transposed_tiles.py OUT.json FILE...

For each FILE (a KernelBench problem) its first ConvTranspose's input, weight and bias are captured from one eager call
(a forward pre-hook), then conv_transpose_forward is timed (triton.testing.do_bench, L2 flushed, median) at
conv_transpose_config's default tile and at each of `candidates()` (the plain convolution's tuner candidates,
kernels/conv.py conv_candidates, and 8-warp tiles), beside cuDNN in TF32 and strict fp32. Each config's output is
checked against the float64 convolution (first 8 samples); the row keeps the worst error and its ratio to strict
cuDNN's (rule 3 allows 2), every config's time, and the fp16 rate of the best (three products).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton

from direct_bench import first_conv
from kfuse.kernels import conv_config as cc
from kfuse.kernels import conv_transpose as ct

TRANSPOSED = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)
EXTRA = ((64, 128, 32, 8, 3), (128, 128, 32, 8, 3), (128, 64, 32, 8, 3), (64, 128, 64, 8, 3), (64, 64, 64, 4, 3))


def candidates(geo) -> list[cc.ConvConfig]:
    default = ct.conv_transpose_config(geo, "fp16x3p", interpret=False)
    out = [default]
    for cfg in cc.conv_candidates(geo, cc.conv_config(geo, "fp16x3p", interpret=False), "fp16x3p"):
        if cfg not in out:
            out.append(cfg)
    for m, n, k, warps, stages in EXTRA:
        cfg = cc.ConvConfig(m, min(n, default.block_n), cc.k_block(geo, k), warps, stages)
        if cfg not in out:
            out.append(cfg)
    return out


def time_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def row_for(path: Path) -> dict:
    conv, x = first_conv(path, TRANSPOSED)
    w, b = conv.weight.detach(), None if conv.bias is None else conv.bias.detach()
    args = (conv.stride, conv.padding, conv.output_padding, conv.groups, conv.dilation)
    geo = ct.conv_transpose_geometry(tuple(x.shape), tuple(w.shape), *args[:4], conv.dilation)
    flops = 2 * x.numel() * w.shape[1] * w[0, 0].numel()  # every input value times its taps and out channels
    k = min(x.shape[0], 8)  # errors on the first 8 samples: the float64 convolution is slow
    with torch.no_grad():
        ref = ct.conv_transpose_ref(x[:k].double(), w.double(), None if b is None else b.double(), *args)
        torch.backends.cudnn.allow_tf32 = False
        strict_err = (ct.conv_transpose_ref(x, w, b, *args)[:k].double() - ref).abs().max().item()
        strict_ms = time_ms(lambda: ct.conv_transpose_ref(x, w, b, *args))
        torch.backends.cudnn.allow_tf32 = True
        tf32_ms = time_ms(lambda: ct.conv_transpose_ref(x, w, b, *args))
        timed = []
        for cfg in candidates(geo):
            try:
                y = ct.conv_transpose_forward(x, w, b, *args, scheme="fp16x3p", cfg=cfg)
                err = (y[:k].double() - ref).abs().max().item()
                timed.append((time_ms(lambda c=cfg: ct.conv_transpose_forward(x, w, b, *args, scheme="fp16x3p",
                                                                              cfg=c)), cfg.short(), err))
            except Exception as e:  # noqa: BLE001 - a config that does not build is reported, not fatal
                print(f"{path.stem} {cfg.short()}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    ms, best, _ = min(timed)
    worst = max(e for _, _, e in timed)
    return {"problem": path.stem, "x": list(x.shape), "w": list(w.shape), "gflop": flops / 1e9,
            "default_ms": timed[0][0], "default_cfg": timed[0][1], "best_ms": ms, "best_cfg": best,
            "fp16_tflops": 3 * flops / ms / 1e9, "err": worst, "strict_err": strict_err,
            "rule3_ratio": worst / strict_err if strict_err else float("inf"), "cudnn_tf32_ms": tf32_ms,
            "cudnn_strict_ms": strict_ms, "all": timed}


def main(argv: list[str]) -> int:
    target, rows = Path(argv[0]), []
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    for path in map(Path, argv[1:]):
        r = row_for(path)
        rows.append(r)
        print(f"{r['problem'][:40]} | default {r['default_ms']:.3f} ({r['default_cfg']}) | best {r['best_ms']:.3f} "
              f"({r['best_cfg']}, {r['fp16_tflops']:.0f} TFLOP/s) | cuDNN TF32 {r['cudnn_tf32_ms']:.3f} strict "
              f"{r['cudnn_strict_ms']:.3f} | err {r['err']:.2e} / strict {r['strict_err']:.2e} "
              f"({r['rule3_ratio']:.2f})", flush=True)
        print("   " + " ".join(f"{c}:{t:.3f}" for t, c, _ in r["all"]), flush=True)
        target.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
