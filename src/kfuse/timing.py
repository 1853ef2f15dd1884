"""The one GPU timing function of kfuse (used by `kfuse bench` and by the `kfuse eval` judge).

Method (DESIGN.md, "Timing"): warm-up calls, then `runs` calls each bracketed by its own pair of CUDA
events, with L2 flushed before each call by writing a 256 MB buffer (so a kernel is never timed reading
inputs an earlier run left in cache). We report the median and the spread; the mean is never quoted
because one preempted run would move it.

Why the references below are captured at import: the judge imports this module *before* it imports a
candidate file, so a candidate that replaces `torch.cuda.Event`, its `record`/`elapsed_time`, or
`torch.cuda.synchronize` cannot change what `time_cuda` calls. `replaced()` tells the judge whether anyone
tried (it compares the live attributes with the captured ones).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current GPU's L2 (H100: 50 MB, H200: 60 MB)
MIN_RUNS = 30  # the design's floor: fewer runs make the median too noisy to compare kernels

# Captured once, before any candidate code can run in this process (see module docstring).
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_event_sync = torch.cuda.Event.synchronize
_synchronize = torch.cuda.synchronize
_CAPTURED: dict[str, Any] = {
    "torch.cuda.Event": _Event,
    "torch.cuda.Event.record": _event_record,
    "torch.cuda.Event.elapsed_time": _event_elapsed,
    "torch.cuda.Event.synchronize": _event_sync,
    "torch.cuda.synchronize": _synchronize,
}


@dataclass(frozen=True)
class Timing:
    """Per-call milliseconds over `n` timed runs; `available` is False (and the numbers NaN) off-GPU."""

    median_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float
    n: int
    available: bool = True
    reason: str = ""  # why timing is unavailable

    @property
    def iqr_ms(self) -> float:
        return self.p90_ms - self.p10_ms  # not a true IQR: the 10-90 spread, reported as such

    def to_json(self) -> dict[str, Any]:
        """JSON-safe: NaN becomes None."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def timing_unavailable(reason: str) -> Timing:
    nan = float("nan")
    return Timing(nan, nan, nan, nan, nan, 0, available=False, reason=reason)


def summarize(times_ms: list[float]) -> Timing:
    """Median, extremes and 10th/90th percentiles of a list of per-run times."""
    if not times_ms:
        return timing_unavailable("no runs")
    ordered = sorted(times_ms)
    if len(ordered) >= 2:
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        p10, p90 = deciles[0], deciles[-1]
    else:
        p10 = p90 = ordered[0]
    return Timing(statistics.median(ordered), ordered[0], ordered[-1], p10, p90, len(ordered))


def replaced() -> list[str]:
    """Names of captured timing functions that are no longer what they were at import."""
    live = {
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Event.record": getattr(_Event, "record", None),
        "torch.cuda.Event.elapsed_time": getattr(_Event, "elapsed_time", None),
        "torch.cuda.Event.synchronize": getattr(_Event, "synchronize", None),
        "torch.cuda.synchronize": torch.cuda.synchronize,
    }
    return [name for name, obj in live.items() if obj is not _CAPTURED[name]]


def time_cuda(fn: Callable[[], Any], *, warmup: int = 5, runs: int = MIN_RUNS) -> Timing:
    """Time `fn()` on the current CUDA device; see the module docstring for the method."""
    if not torch.cuda.is_available():
        return timing_unavailable("no CUDA device: timing needs a GPU")
    runs = max(runs, MIN_RUNS)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    for _ in range(warmup):
        fn()
    _synchronize()
    # All events exist before the first timed call, created from the captured class.
    starts = [_Event(enable_timing=True) for _ in range(runs)]
    ends = [_Event(enable_timing=True) for _ in range(runs)]
    for start, end in zip(starts, ends):
        flush.zero_()  # a 256 MB write evicts everything the previous run left in L2
        _event_record(start)
        fn()
        _event_record(end)
    _synchronize()
    times = [_event_elapsed(s, e) for s, e in zip(starts, ends)]
    del flush
    return summarize(times)
