"""The direct tile (kernels/conv_direct.py) against the padded implicit GEMM, convolution alone, at full size.

    python3 benchmarks/conv/direct_bench.py OUT.json FILE...

For each FILE (a KernelBench problem) its first convolution's input, weight and bias are captured from one eager call
on the GPU (a forward pre-hook), then `conv_forward` is timed (triton.testing.do_bench, L2 flushed, median) under
"fp16x3p" (the padded tile), "direct64" and "direct32", each direct scheme at its default and every tuner candidate
(kernels/conv.py DIRECT_TUNE_TILES), beside cuDNN in TF32 (torch's default) and strict fp32. Each row gets the
output's max abs error against the float64 convolution and, for rule 3, the ratio to strict fp32 cuDNN's own error
(at most 2 passes). One JSON row per file and scheme; a table on stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton

from kfuse.kernels import conv as cv
from kfuse.kernels import conv_config as cc
from kfuse.load import load_problem

CONVS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def first_conv(path: Path, kinds: tuple = CONVS) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model's first module of `kinds` and its input, captured from one eager call on the GPU."""
    problem = load_problem(path)
    torch.manual_seed(0)
    model = problem.build().cuda()
    inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in problem.inputs()]
    conv = next(m for m in model.modules() if isinstance(m, kinds))
    seen: list[torch.Tensor] = []
    hook = conv.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().contiguous()))
    with torch.no_grad():
        model(*inputs)
    hook.remove()
    return conv, seen[0]


def time_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def rows_for(path: Path) -> list[dict]:
    conv, x = first_conv(path)
    w, b = conv.weight.detach(), None if conv.bias is None else conv.bias.detach()
    args = (conv.stride, conv.padding, conv.dilation, conv.groups)
    with torch.no_grad():
        ref = cv.conv_ref(x.double(), w.double(), None if b is None else b.double(), *args)
        torch.backends.cudnn.allow_tf32 = False
        strict_err = (cv.conv_ref(x, w, b, *args).double() - ref).abs().max().item()
        strict_ms = time_ms(lambda: cv.conv_ref(x, w, b, *args))
        torch.backends.cudnn.allow_tf32 = True
        tf32_ms = time_ms(lambda: cv.conv_ref(x, w, b, *args))
    geo = cv.conv_geometry(tuple(x.shape), tuple(w.shape), *args)
    base = {"problem": path.stem, "x": list(x.shape), "w": list(w.shape), "gflop": 2 * geo.M * geo.C_out * geo.K / 1e9,
            "cudnn_tf32_ms": tf32_ms, "cudnn_strict_ms": strict_ms, "strict_err": strict_err}
    out = []
    for scheme in ("fp16x3p", "direct64", "direct32"):
        default = cc.conv_config(geo, scheme, interpret=False)
        cfgs = cc.conv_candidates(geo, default, scheme) if scheme in cc.DIRECT_SCHEMES else [default]
        timed = []
        for cfg in cfgs:
            try:
                y = cv.conv_forward(x, w, b, *args, scheme=scheme, cfg=cfg)
                timed.append((time_ms(lambda c=cfg: cv.conv_forward(x, w, b, *args, scheme=scheme, cfg=c)), cfg, y))
            except Exception as err:  # noqa: BLE001 - a config that does not build is reported, not fatal
                print(f"{path.stem} {scheme} {cfg.short()}: {type(err).__name__}: {str(err)[:120]}", flush=True)
        if not timed:
            continue
        default_ms = next((t for t, c, _ in timed if c == default), float("nan"))
        ms, cfg, y = min(timed, key=lambda r: r[0])
        err = (y.double() - ref).abs().max().item()
        out.append({**base, "scheme": scheme, "default_ms": default_ms, "best_ms": ms, "best_cfg": cfg.short(),
                    "err": err, "rule3_ratio": err / strict_err if strict_err else float("inf")})
    return out


def main(argv: list[str]) -> int:
    target, files = Path(argv[0]), [Path(f) for f in argv[1:]]
    rows = []
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    print("problem | scheme | GFLOP | default ms | best ms (cfg) | cuDNN TF32 / strict ms | err / strict err")
    for path in files:
        for r in rows_for(path):
            rows.append(r)
            print(f"{r['problem']} | {r['scheme']} | {r['gflop']:.1f} | {r['default_ms']:.3f} | {r['best_ms']:.3f} "
                  f"({r['best_cfg']}) | {r['cudnn_tf32_ms']:.3f} / {r['cudnn_strict_ms']:.3f} | "
                  f"{r['err']:.2e} / {r['strict_err']:.2e} ({r['rule3_ratio']:.2f})", flush=True)
        target.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
