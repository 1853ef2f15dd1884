"""A training step (grads to None, forward, backward for a fixed upstream gradient), eager fp32 against the
generated ModelNew, kfuse.timing.time_cuda (CUDA events, L2 flushed, median of 30): `kfuse bench --train`'s
method without the torch.compile baselines, for a quick check of one backward change.

    PYTHONPATH=src python3 benchmarks/train/step_time.py PROBLEM...
"""

from __future__ import annotations

import sys

from kfuse.timing import time_cuda
from steps import training_steps


def main() -> None:
    for arg in sys.argv[1:]:
        s = training_steps(arg)
        e, k = time_cuda(s.eager_step).median_ms, time_cuda(s.fused_step).median_ms
        print(f"{s.name}: training step eager {e:.3f} ms, kfuse {k:.3f} ms, {e / k:.2f}x")


if __name__ == "__main__":
    main()
