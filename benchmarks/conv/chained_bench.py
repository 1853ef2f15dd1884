"""fp16x3p's K loop, chained accumulators or a fresh partial per block (kernels/conv.py CHAINED), convolution alone.

    KFUSE_CONV_CHAINED=1 python3 benchmarks/conv/chained_bench.py OUT.json FILE...
    KFUSE_CONV_CHAINED=0 python3 benchmarks/conv/chained_bench.py OUT.json FILE...

The switch is read when kfuse is imported, so each setting is its own process (run them alternately for the A/B).
For each FILE (a KernelBench problem) its first convolution's input, weight and bias are captured from one eager call
(a forward pre-hook); a plain convolution's conv_forward is timed at conv_config's default tile and at each of the
tuner's candidates (conv_candidates), a transposed one's conv_transpose_forward at its default (triton.testing.do_bench,
L2 flushed, median), beside cuDNN in TF32 and strict fp32. Each row: the output's max abs error against the float64
convolution (first 8 samples) and its ratio to strict cuDNN's (rule 3 allows 2), the fp16 rate of the best time
(three products).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton

from kfuse.kernels import conv as cv
from kfuse.kernels import conv_transpose as ct
from kfuse.load import load_problem

PLAIN = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
TRANSPOSED = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)


def first_conv(path: Path) -> tuple[torch.nn.Module, torch.Tensor]:
    problem = load_problem(path)
    torch.manual_seed(0)
    model = problem.build().cuda()
    inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in problem.inputs()]
    conv = next(m for m in model.modules() if isinstance(m, PLAIN + TRANSPOSED))
    seen: list[torch.Tensor] = []
    hook = conv.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().contiguous()))
    with torch.no_grad():
        model(*inputs)
    hook.remove()
    return conv, seen[0]


def time_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def row_for(path: Path) -> dict:
    conv, x = first_conv(path)
    w, b = conv.weight.detach(), None if conv.bias is None else conv.bias.detach()
    transposed = isinstance(conv, TRANSPOSED)
    if transposed:
        args = (conv.stride, conv.padding, conv.output_padding, conv.groups, conv.dilation)
        ref_fn, ours = ct.conv_transpose_ref, ct.conv_transpose_forward
        flops = 2 * x.numel() * w.shape[1] * w[0, 0].numel()  # every input value times its taps and out channels
        cfgs = [None]
    else:
        args = (conv.stride, conv.padding, conv.dilation, conv.groups)
        ref_fn, ours = cv.conv_ref, cv.conv_forward
        geo = cv.conv_geometry(tuple(x.shape), tuple(w.shape), *args)
        flops = 2 * geo.M * geo.C_out * geo.K
        cfgs = cv.conv_candidates(geo, cv.conv_config(geo, "fp16x3p", interpret=False), "fp16x3p")
    k = min(x.shape[0], 8)  # errors on the first 8 samples: the float64 convolution is slow
    with torch.no_grad():
        ref = ref_fn(x[:k].double(), w.double(), None if b is None else b.double(), *args)
        torch.backends.cudnn.allow_tf32 = False
        strict_err = (ref_fn(x, w, b, *args)[:k].double() - ref).abs().max().item()
        strict_ms = time_ms(lambda: ref_fn(x, w, b, *args))
        torch.backends.cudnn.allow_tf32 = True
        tf32_ms = time_ms(lambda: ref_fn(x, w, b, *args))
        timed = []
        for cfg in cfgs:
            y = ours(x, w, b, *args, scheme="fp16x3p", cfg=cfg)
            err = (y[:k].double() - ref).abs().max().item()
            timed.append((time_ms(lambda c=cfg: ours(x, w, b, *args, scheme="fp16x3p", cfg=c)), cfg, err))
    ms, cfg, err = min(timed, key=lambda r: r[0])
    return {"problem": path.stem, "chained": bool(cv.CHAINED.value), "x": list(x.shape), "w": list(w.shape),
            "gflop": flops / 1e9, "default_ms": timed[0][0], "best_ms": ms,
            "best_cfg": "default" if cfg is None else cfg.short(), "fp16_tflops": 3 * flops / ms / 1e9,
            "err": max(e for _, _, e in timed), "strict_err": strict_err, "rule3_ratio": max(e for _, _, e in timed)
            / strict_err if strict_err else float("inf"), "cudnn_tf32_ms": tf32_ms, "cudnn_strict_ms": strict_ms,
            "all": [(t, "default" if c is None else c.short(), e) for t, c, e in timed]}


def main(argv: list[str]) -> int:
    target, rows = Path(argv[0]), []
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
          f"CHAINED={cv.CHAINED.value}")
    for path in map(Path, argv[1:]):
        r = row_for(path)
        rows.append(r)
        print(f"{r['problem'][:40]} | default {r['default_ms']:.3f} | best {r['best_ms']:.3f} ({r['best_cfg']}, "
              f"{r['fp16_tflops']:.0f} TFLOP/s) | cuDNN TF32 {r['cudnn_tf32_ms']:.3f} strict {r['cudnn_strict_ms']:.3f}"
              f" | err {r['err']:.2e} / strict {r['strict_err']:.2e} ({r['rule3_ratio']:.2f})", flush=True)
        target.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
