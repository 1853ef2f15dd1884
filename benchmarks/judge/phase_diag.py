"""Where a `kfuse eval` spends its seconds beyond the phases: every judge-to-worker request and judge-clock exchange
timed by op (calls split by their `profile` and `late` flags), and each timed draw, over real evaluations.
Usage: python benchmarks/judge/phase_diag.py OUT.json REF.py CAND.py [REF.py CAND.py ...]
(each pair judged twice: caches as they are, then again with references and baselines cached)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict

from kfuse.judge import evaluate as ev
from kfuse.judge import shapes, speed
from kfuse.judge.ipc import WorkerHandle

LOG: dict[str, list[float]] = defaultdict(list)


def _timed(name_of, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            LOG[name_of(*args, **kwargs)].append(time.perf_counter() - t0)
    return wrapper


def request_name(self, op, cap=0, **fields) -> str:
    flags = [k for k in ("profile", "late", "poison") if fields.get(k)]
    return f"request:{op}" + "".join(f"+{f}" for f in flags)


WorkerHandle.request = _timed(request_name, WorkerHandle.request)
WorkerHandle.quick = _timed(lambda self, message: f"quick:{message!r}", WorkerHandle.quick)
WorkerHandle.__init__ = _timed(lambda self, **kw: "worker_spawn", WorkerHandle.__init__)  # returns at once
WorkerHandle.wait_ready = _timed(lambda self: "worker_wait_ready", WorkerHandle.wait_ready)  # what overlap left
speed.timed_draw = _timed(lambda *a: "timed_draw", speed.timed_draw)
shapes.references = _timed(lambda *a: "references(shape)", shapes.references)


def summary() -> dict:
    return {k: {"n": len(v), "total_s": round(sum(v), 3), "median_ms": round(statistics.median(v) * 1e3, 2)}
            for k, v in sorted(LOG.items(), key=lambda kv: -sum(kv[1]))}


def main() -> None:
    out, pairs = sys.argv[1], sys.argv[2:]
    results = []
    for ref, cand in zip(pairs[::2], pairs[1::2]):
        for run in ("first", "again"):
            LOG.clear()
            cfg = ev.EvalConfig(device="cuda", seed=21, perf_trials=100)
            t0 = time.perf_counter()
            rec = ev.evaluate(ref, cand, cfg)
            results.append({"candidate": cand, "run": run, "elapsed_s": round(time.perf_counter() - t0, 3),
                            "correct": rec.correct, "flags": rec.flags, "phases_s": rec.phases_s,
                            "ops": summary()})
            print(json.dumps(results[-1], indent=1), flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
