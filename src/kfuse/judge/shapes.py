"""The shapes a candidate is judged at, and every one's references, computed in the judge process before any
candidate code runs.

Shapes: the problem as given (`trials` draws), the batch changed and, where the file names feature sizes the
reference accepts changed, those changed (one draw each), each by an odd step drawn per run from the base
seed: kernels must mask, not specialize. REF is read once (`snapshot_reference`) and every shape is built from
those bytes; a shape's references are eager in the chosen precision and float64 (verify.reference_run).
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from kfuse.errors import KfuseError, ProblemError
from kfuse.judge import cache
from kfuse.judge.ipc import tensor_bytes
from kfuse.load import Problem
from kfuse.verify import DTYPES, Reference, Results, reference_run, seeded_build

if TYPE_CHECKING:
    from kfuse.judge.evaluate import EvalConfig, EvalRecord

FEATURE_NAME = re.compile(r"(features|channels|hidden\w*|_dim|^dim|embed\w*|d_model)$")
# The references seed torch's global RNG: evaluations that run side by side (threads) take turns.
REFERENCE_LOCK = threading.Lock()


@dataclass(frozen=True)
class Shape:
    label: str  # "" for the problem as given, else the changed constants ("batch_size=53")
    problem: Problem
    model_seed: int  # builds the model and seeds its forward (Dropout); the worker sees it
    input_seeds: tuple[int, ...]  # draw the inputs; the worker never sees them


# --- planning: everything the candidate must not know is drawn here, from a key it never sees ----------


def derive(seed: int, *parts: object) -> int:
    """A 31-bit number from the base seed and a purpose: knowing one derived number (a model seed) tells
    nothing about another (an input seed) or about the base."""
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFF_FFFF


def odd_step(seed: int, name: str, value: int) -> int:
    """A size change drawn per run: value + 5..63, the new size odd (off every power-of-two tile, so a
    kernel without a masked tail fails) and not a multiple of any tile the old size was."""
    step = EXTRA_STEPS[derive(seed, "step", name) % len(EXTRA_STEPS)]
    return step if (value + step) % 2 else step + 1


EXTRA_STEPS = tuple(range(5, 64))


def extra_problems(problem: Problem, seed: int) -> list[tuple[Problem, str]]:
    """The extra shapes: the batch changed, and every feature-size constant changed (where the reference
    accepts it), each by a step drawn per run; labels name the new values."""
    out = []
    consts = problem.constants()
    batch = problem.batch_constant()
    if batch is not None:
        value = int(consts[batch])
        new = value + odd_step(seed, batch, value)
        try:
            out.append((problem.with_overrides({batch: new}), f"{batch}={new}"))
        except ProblemError:
            pass
    names = [n for n, v in consts.items() if isinstance(v, int) and v > 1 and n != batch and FEATURE_NAME.search(n)]
    if names:
        changes = {n: int(consts[n]) + odd_step(seed, n, int(consts[n])) for n in names}
        try:
            out.append((problem.with_overrides(changes), ",".join(f"{n}={v}" for n, v in changes.items())))
        except ProblemError:
            pass
    return out


def plan_shapes(problem: Problem, seed: int, trials: int, extra: bool) -> list[Shape]:
    def plan(k: int, prob: Problem, label: str, n: int) -> Shape:
        return Shape(label, prob, derive(seed, "model", k), tuple(derive(seed, "input", k, i) for i in range(n)))

    shapes = [plan(0, problem, "", trials)]
    if extra:
        shapes += [plan(k, prob, label, 1) for k, (prob, label) in enumerate(extra_problems(problem, seed), start=1)]
    return shapes


@dataclass
class PlannedShape:
    """A shape with its references, computed before the candidate's code reaches its worker."""

    shape: Shape
    refs: list[Reference]
    pristine: torch.nn.Module


def prepare(problem: Problem, seed: int, cfg: EvalConfig, record: EvalRecord,
            ref_sha256: str) -> list[PlannedShape]:
    """Every shape's references, from the one snapshot of REF, before any candidate code runs."""
    planned = []
    for shape in plan_shapes(problem, seed, cfg.trials, cfg.extra_shapes):
        try:
            with REFERENCE_LOCK:
                planned.append(references(shape, cfg, ref_sha256))
        except Exception as err:  # noqa: BLE001 - only extra shapes get here: the given one already ran
            if not shape.label:
                raise KfuseError(f"{record.ref}: the reference fails on its own inputs ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0] if str(err) else ''})") from None
            record.notes.append(f"extra shape {shape.label} skipped: the reference fails there ({type(err).__name__})")
    return planned


def references(shape: Shape, cfg: EvalConfig, ref_sha256: str) -> PlannedShape:
    """One shape's reference runs, from the disk cache when this file, shape and seeds were computed before
    on this machine (cache.py), else computed and stored."""
    k = cache.key(kind="references", ref=ref_sha256, overrides=dict(shape.problem.overrides), shape=shape.label,
                  model_seed=shape.model_seed, input_seeds=list(shape.input_seeds), device=cfg.device,
                  precision=cfg.precision, code=cache.code_version())
    hit = cache.load_tensors(k, {"Reference": Reference, "Results": Results}) if cfg.cache_references else None
    if hit is not None:
        pristine = seeded_build(shape.problem, shape.model_seed, device=cfg.device).to(dtype=DTYPES[cfg.precision])
        pristine.load_state_dict(hit["state"], strict=True)
        return PlannedShape(shape, hit["refs"], pristine.to("cpu"))
    runs = [reference_run(shape.problem, shape.model_seed, cfg.device, cfg.precision, input_seed=s)
            for s in shape.input_seeds]
    # the pristine model waits on the host: the device is the candidate's and the baselines' while they run
    plan = PlannedShape(shape, [r for r, _ in runs], runs[0][1].to("cpu"))
    del runs
    if cfg.cache_references:
        state = {n: v.detach().cpu() for n, v in plan.pristine.state_dict().items()}
        value = {"refs": plan.refs, "state": state}
        cache.store_tensors(k, value, tensor_bytes([cache.pack(r) for r in plan.refs]))
    return plan


def snapshot_reference(ref_path: Path, folder: Path) -> Path:
    """REF read once, into a folder only the judge can see: every shape variant is built from these bytes,
    so a file rewritten after the candidate starts changes nothing."""
    try:
        data = ref_path.read_bytes()
    except OSError as err:
        raise ProblemError(f"{ref_path}: cannot read ({err.strerror})") from None
    copy_path = folder / ref_path.name
    copy_path.write_bytes(data)
    return copy_path
