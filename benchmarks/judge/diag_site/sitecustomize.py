"""Loaded by every Python started with this folder on PYTHONPATH (worker_diag.py, unsandboxed only): where
KFUSE_GO_TIMES names a file, the worker's timed call records its own pieces there (ms: forward launched,
synchronized, output kept), so the judge's clock can be compared with the worker's."""

import json
import os
import time

if os.environ.get("KFUSE_GO_TIMES"):
    import torch

    from kfuse.judge import worker as _w
    from kfuse.verify import flatten

    _times: list = []

    def _go(self) -> None:
        key, inputs = self.staged
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.models[key](*inputs)
        t1 = time.perf_counter()
        _w._real_sync()
        t2 = time.perf_counter()
        self.kept.append([o.detach().clone() for o in flatten(out)])
        t3 = time.perf_counter()
        _times.append([(t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3])
        with open(os.environ["KFUSE_GO_TIMES"], "w") as f:
            json.dump(_times, f)

    _w.Worker.go = _go
