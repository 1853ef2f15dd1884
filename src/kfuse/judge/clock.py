"""Timing by the judge's clock: speed a candidate cannot fake from inside its process.

For each timed call the judge (1) sends a fresh input set (`stage`: the worker puts it on the device and
evicts L2; untimed), then (2) starts its own clock, sends one byte (`go`), and stops the clock when the
worker's one-byte reply arrives: the forward ran and the whole device was synchronized (side streams
included). The protocol's own cost, measured the same way with a no-op (`nop`), is subtracted. After each
batch of timed calls, the judge picks some of them at random (always the last one too) and checks their
outputs against references it computes for those very inputs; the worker cannot know which, since it is
asked after the calls ran. So a candidate that is fast only on repeated inputs (every call gets new
tensors), only while being timed, or stale after N calls returns wrong timed outputs, and a forged timer
changes nothing (the worker's clock decides nothing).

Known limit: the worker shares its process with the candidate, so a candidate that rewrites the serving
loop can do work between `stage` and `go` (it has the inputs then). The judge times `stage` too and flags
a candidate whose staging takes longer than the reference's by more than its own timed call.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from kfuse.judge.ipc import WorkerHandle, tensor_bytes
from kfuse.judge.stage_area import Area
from kfuse.judge.worker import INLINE_GO, INLINE_NEXT, INLINE_NOP
from kfuse.timing import Timing, summarize

Draw = Callable[[int], list[torch.Tensor]]  # timed call i -> its fresh inputs (the judge's seeds)
Check = Callable[[int, list[torch.Tensor]], list[str]]  # timed call i, its outputs -> failures


@dataclass(frozen=True)
class ClockConfig:
    runs: int = 100
    warmup: int = 5
    checks_per_batch: int = 2  # random picks besides the batch's last call
    budget_bytes: int = 4 << 30  # device memory for the inputs and outputs a batch of timed calls holds
    batch_staging: bool = True  # one stage request per batch of timed calls (False: one per call)


@dataclass
class ClockResult:
    timing: Timing  # the timed calls minus the protocol's cost
    raw_ms: list[float] = field(default_factory=list)
    stage_ms: list[float] = field(default_factory=list)
    overhead_ms: float = 0.0
    checked: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    staged_via: list[str] = field(default_factory=list)  # each stage request's path (staging.device_sets)


def batch_size(out_bytes: int, in_bytes: int, cfg: ClockConfig) -> int:
    """How many timed calls run before the judge picks outputs: as many as the kept outputs fit."""
    per_call = max(1, out_bytes + in_bytes)
    return max(1, min(cfg.runs, cfg.budget_bytes // per_call))


def pick(batch: Sequence[int], k: int, rng: random.Random) -> list[int]:
    """Positions in the batch to check: k at random and the last (a candidate stale after N calls)."""
    positions = list(range(len(batch)))
    chosen = set(rng.sample(positions, min(k, len(positions))))
    chosen.add(positions[-1])
    return sorted(chosen)


def protocol_cost(worker: WorkerHandle, n: int = 30) -> float:
    """Median seconds of a no-op exchange: what every timed call carries besides the forward."""
    return statistics.median(worker.quick(INLINE_NOP) for _ in range(n))


def timed_calls(worker: WorkerHandle, key: str, calls: Sequence[int], draw: Draw, cfg: ClockConfig,
                reserve: int, area: Area | None = None) -> tuple[list[float], list[float], list[str]]:
    """(judge-clock ms, staging ms) of each call and each stage request's path: its inputs staged (one request
    per call, or one for all `calls` with `cfg.batch_staging`), `next` (untimed: the set becomes the call's, L2
    evicted), then `go`."""
    raw, stage, via = [], [], []
    ahead = 0.0
    if cfg.batch_staging:
        t0 = time.perf_counter()
        via.append(worker.stage(key, list(calls), draw, reserve, area))
        ahead = (time.perf_counter() - t0) * 1e3 / max(len(calls), 1)
    for n, i in enumerate(calls):
        t0 = time.perf_counter()
        if not cfg.batch_staging:
            via.append(worker.stage(key, [i], draw, reserve if n == 0 else 0, area))
        worker.quick(INLINE_NEXT)
        stage.append(ahead + (time.perf_counter() - t0) * 1e3)
        raw.append(worker.quick(INLINE_GO) * 1e3)
    return raw, stage, via


def time_outside(worker: WorkerHandle, key: str, draw: Draw, check: Check, cfg: ClockConfig,
                 out_bytes: int, seed: int, area: Area | None = None) -> ClockResult:
    """Warm up on fresh draws, then `cfg.runs` timed calls, each on a fresh draw, outputs checked in
    batches. Negative i are the warm-up draws. `area`: the evaluation's stage file, allocated ahead."""
    rng = random.Random(seed)
    in_bytes = tensor_bytes(draw(0))
    _, _, via = timed_calls(worker, key, range(-cfg.warmup, 0), draw, cfg, 0, area)
    worker.request("kept", indices=[])
    overhead = protocol_cost(worker)
    raw, stage = [], []
    checked: list[int] = []
    failures: list[str] = []
    size = batch_size(out_bytes, in_bytes, cfg)
    for start in range(0, cfg.runs, size):
        batch = list(range(start, min(start + size, cfg.runs)))
        r, s, v = timed_calls(worker, key, batch, draw, cfg, out_bytes * len(batch), area)
        raw += r
        stage += s
        via += v
        positions = pick(batch, cfg.checks_per_batch, rng)
        answer = worker.request("kept", cap=4 * out_bytes * len(positions) + (8 << 20), indices=positions)
        for pos, outs in zip(positions, answer.get("outputs_list") or []):
            checked.append(batch[pos])
            failures += [f"timed call {batch[pos]}: {f}" for f in check(batch[pos], outs)]
        if not answer["ok"] or len(answer.get("outputs_list") or []) != len(positions):
            failures.append(f"the outputs of timed calls {[batch[p] for p in positions]} were not returned")
    net = [max(r - overhead * 1e3, 0.0) for r in raw]
    return ClockResult(summarize(net), raw, stage, overhead * 1e3, checked, failures, via)


class Gate:
    """Timing must have the device to itself; everything else may share it. Evaluations that run side by
    side (eval-suite --jobs) take `shared()` for imports, builds and correctness calls (so candidates
    compile in parallel) and `exclusive()` for timing; a waiting timer goes before new sharers."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sharers = 0
        self._timing = False
        self._waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._timing and not self._waiting)
            self._sharers += 1
        try:
            yield
        finally:
            with self._cond:
                self._sharers -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._timing and not self._sharers)
            self._waiting -= 1
            self._timing = True
        try:
            yield
        finally:
            with self._cond:
                self._timing = False
                self._cond.notify_all()


GATE = Gate()
