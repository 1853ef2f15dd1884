"""Sweep the tiles of a generated dZ kernel (kernels/backward_ops.dz_tiles) on one problem's training step:
each candidate is patched into the generated module, timed with kfuse.timing.time_cuda (the bench's method) and
its gradients compared with the default tiles' (they must agree to float64-summation-order noise).

    PYTHONPATH=src python3 benchmarks/train/dz_tiles.py PROBLEM
"""

from __future__ import annotations

import sys

from kfuse.timing import time_cuda
from steps import training_steps

CANDIDATES = [(4, 512, 32, 4), (4, 512, 8, 4), (4, 512, 64, 4), (2, 512, 64, 4), (4, 256, 32, 2),
              (8, 512, 16, 4), (4, 1024, 32, 8), (8, 256, 16, 2), (16, 128, 1, 4)]


def main() -> None:
    s = training_steps(sys.argv[1])
    module, fused, inputs, step = s.module, s.fused, s.inputs, s.fused_step
    default = module.dz_tiles
    shape = next(iter(fused.parameters())).shape
    print(s.name, "default tiles", default(inputs[0].shape[0], shape[0]))
    base = None
    for cand in [None, *CANDIDATES]:
        if cand is not None:
            module.dz_tiles = lambda M, N, c=cand: module.DzTiles(*c)
        step()
        grads = [p.grad.detach().clone() for p in fused.parameters()]
        if base is None:
            base = grads
        worst = max(((g - b).abs().max() / b.abs().max().clamp(min=1e-30)).item() for g, b in zip(grads, base))
        t = time_cuda(step)
        print(f"  {str(cand or 'default'):22} step {t.median_ms:.3f} ms  grads vs default {worst:.1e}", flush=True)
    module.dz_tiles = default


if __name__ == "__main__":
    main()
