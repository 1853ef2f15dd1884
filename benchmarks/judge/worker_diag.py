"""Where a timed call's extra milliseconds come from: the same candidate timed four ways on one GPU.

- `in_process`: the worker's own `Worker` class in this process, no pipe: stage and next, then go timed;
  also the pieces of go (forward launched, synchronize, clone) timed apart;
- `plain`: the candidate imported and called in this process without the worker's counters;
- `unsandboxed` / `sandboxed`: the judge's protocol (`clock.time_outside`, inputs staged per call and per batch)
  through a worker process, without and with bubblewrap, beside the worker's CUDA-event time (`time` request) and
  calls on inputs staged once (`go_only_ms`).
Usage: KFUSE_GO_TIMES=/tmp/kfuse_go_times.json PYTHONPATH=src:benchmarks/judge/diag_site \
    python benchmarks/judge/worker_diag.py REF.py CAND.py OUT.json [PART ...]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from kfuse.judge.clock import ClockConfig, time_outside
from kfuse.judge.ipc import WorkerHandle
from kfuse.judge.worker import INLINE_GO, INLINE_NEXT, Worker
from kfuse.load import load_problem
from kfuse.verify import flatten, seeded_build, seeded_inputs

GO_TIMES = Path("/tmp/kfuse_go_times.json")


def draws(problem, n: int) -> list[list[torch.Tensor]]:
    return [[t.cpu() for t in seeded_inputs(problem, 1000 + i, device="cuda")] for i in range(n)]


def in_process(cand: Path, problem, state, inputs) -> dict:
    w = Worker()
    assert w.load({"path": str(cand), "device": "cuda", "precision": "fp32"})["ok"]
    assert w.build({"key": "", "seed": 1, "init_inputs": problem.init_inputs(), "state": state})["ok"]
    go, fwd, sync, clone = [], [], [], []
    for i, xs in enumerate(inputs):
        w.stage({"key": "", "inputs_list": [xs, xs], "reserve": 0})
        w.next_call()
        t0 = time.perf_counter()
        w.go()
        go.append((time.perf_counter() - t0) * 1e3)
        w.next_call()
        key, staged = w.staged
        t0 = time.perf_counter()
        with torch.no_grad():
            out = w.models[key](*staged)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        kept = [o.detach().clone() for o in flatten(out)]
        t3 = time.perf_counter()
        fwd.append((t1 - t0) * 1e3), sync.append((t2 - t1) * 1e3), clone.append((t3 - t2) * 1e3)
        del kept, out
    med = statistics.median
    return {"go_ms": med(go[3:]), "forward_launch_ms": med(fwd[3:]), "sync_ms": med(sync[3:]),
            "clone_ms": med(clone[3:])}


def plain(cand: Path, problem, state, inputs) -> dict:
    import importlib.util
    spec = importlib.util.spec_from_file_location("plain_cand", cand)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["plain_cand"] = mod
    spec.loader.exec_module(mod)
    torch.manual_seed(1)
    model = mod.ModelNew(*problem.init_inputs())
    model.load_state_dict(state)
    model = model.cuda()
    times = []
    for xs in inputs:
        xs = [x.cuda() for x in xs]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model(*xs)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"wall_ms": statistics.median(times[3:])}


def through_worker(cand: Path, problem, state, inputs, isolated: bool) -> dict:
    with WorkerHandle(interpret=False, timeout_s=300, isolated=isolated, gpu=True) as w:
        assert w.request("load", path=w.hand_over(cand.name, cand.read_bytes()), device="cuda", precision="fp32")["ok"]
        assert w.request("build", key="", seed=1, init_inputs=problem.init_inputs(), state=state)["ok"]
        out_bytes = 64 << 20  # a cap on the kept outputs sent back (unchecked here)
        out = {}
        for batch in (False, True):
            cfg = ClockConfig(runs=len(inputs) - 3, warmup=3, batch_staging=batch)
            res = time_outside(w, "", lambda i: inputs[i % len(inputs)], lambda i, o: [], cfg, out_bytes, 0)
            out[f"batch_staging={batch}"] = {"clock_ms": res.timing.median_ms, "overhead_ms": res.overhead_ms,
                                             "stage_ms": statistics.median(res.stage_ms)}
        ev = w.request("time", key="", inputs=inputs[0], warmup=3, runs=30)
        w.request("stage", key="", inputs_list=[inputs[0]])  # staged once, then timed calls back to back
        w.quick(INLINE_NEXT)
        again = [w.quick(INLINE_GO) * 1e3 for _ in range(20)]
        w.request("kept", cap=1 << 30, indices=[])
        out.update({"events_ms": ev["timing"]["median_ms"], "go_only_ms": statistics.median(again[3:])})
    if GO_TIMES.exists():  # the worker's own pieces of each go (unsandboxed: diag_site/sitecustomize.py)
        pieces = json.loads(GO_TIMES.read_text())[3:]
        out["worker_forward_sync_clone_ms"] = [round(statistics.median(p[j] for p in pieces), 3) for j in range(3)]
        GO_TIMES.unlink()
    return out


def main() -> None:
    ref, cand, out_path = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    problem = load_problem(ref, {})
    state = {k: v.cpu() for k, v in seeded_build(problem, 1, device="cuda").state_dict().items()}
    inputs = draws(problem, 23)
    res = {"ref": str(ref), "cand": str(cand), "gpu": torch.cuda.get_device_name()}
    for name, fn in (("unsandboxed", lambda: through_worker(cand, problem, state, inputs, False)),
                     ("sandboxed", lambda: through_worker(cand, problem, state, inputs, True)),
                     ("in_process", lambda: in_process(cand, problem, state, inputs)),
                     ("plain", lambda: plain(cand, problem, state, inputs))):
        if sys.argv[4:] and name not in sys.argv[4:]:
            continue
        try:
            res[name] = fn()
        except Exception as err:  # noqa: BLE001 - a diagnostic: report and go on
            res[name] = f"{type(err).__name__}: {err}"
        print(name, res[name], flush=True)
    Path(out_path).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
