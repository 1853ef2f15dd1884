"""A small instance of a problem for the CPU: its size constants halved until the eager forward is cheap.

KernelBench files are sized for a GPU (level1/19_ReLU holds 12 GB of tensors); on the CPU, where the generated
kernels run in Triton's interpreter, kfuse needs the same model at a size that runs in milliseconds.
`choose_sizes` returns the `--set` overrides for that:

- size constants: module-level ints (or lists/tuples of ints) that the file writes as literals (`batch_size =
  128`, `height, width = 224, 224`, `layer_sizes = [400, 800]`); constants derived from them (`hidden = 2 *
  in_features`) follow. Ints below MIN_SIZE are left alone (`dim = 1` is an axis, `in_channels = 3` an image's),
  except a batch, which may go down to 1; so are names that shape the computation rather than size it
  (kernel_size, stride, padding, groups, heads, ...).
- search: the largest constants are halved (all those within 2x of the largest at once, several times at once
  while the cost is far over budget), each candidate measured on the meta device: no memory, no random init.
  A candidate whose file, constructor, inputs or forward raises is rejected, and so is one that makes a grouped
  convolution depthwise (conv_structure); then every constant is halved at once (that keeps ratios such as
  `out_channels == 2 * width`), and after that one at a time, a constant that breaks the model keeping its last
  size. It stops once every tensor the forward makes, its parameters and
  inputs, and its flops fit `Budget`, or nothing is left to halve.
- confirm: the chosen candidate runs once for real on the CPU; where that raises, the previous (larger) ones are
  tried; where it is still slow, it is halved further with real runs. A forward that cannot run on meta (it
  reads values) is sized by its parameters and inputs alone; a constructor that cannot (it calls `.item()`) is
  searched with real runs, never building inputs larger than `real_elements`.

Tries and seconds are bounded: the meta search stops after `search_seconds`; a real one goes on while its time
so far is below what the verification would spend on the candidate it holds (`verify_runs` forwards of it: a
smaller candidate's try costs less than one), at most `real_search_seconds`. So this takes seconds for most
files, and longer only where the eager forward itself is slow (level 3 problem 30, SwinV2, whose constructor
cannot run on meta: 3.8 s a forward at a batch of 5 after 6 s of search, a batch of 1 now).
"""

from __future__ import annotations

import ast
import copy
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from kfuse.load import BATCH_NAMES, Problem, assignments

MIN_SIZE = 8  # ints from this up are sizes, halved down to MIN_SIZE // 2 at least
MIN_BATCH = 2  # a batch from this up is halved, down to 1
MAX_STEPS = 6  # halvings of one candidate at most (a factor of 64)
# Names that shape the computation rather than size it: changing them changes the model or breaks it.
STRUCTURAL = re.compile(r"kernel|stride|pad|dilation|group|head|pool|patch|window|ratio|scale|factor|eps|"
                        r"momentum|drop|prob|axis|seed", re.IGNORECASE)

State = dict[str, Any]  # constant name -> value (int, or list/tuple of ints)


@dataclass(frozen=True)
class Budget:
    elements: int = 2**18  # every tensor the forward makes, plus parameters and inputs (1 MB in fp32)
    flops: int = 2**26
    seconds: float = 0.2  # one eager forward, run for real
    ops: int = 2_000  # ops one meta forward may dispatch before it counts as too large (DenseNet201: 620)
    meta_seconds: float = 2.0  # a safety net in seconds (the op count decides: it does not depend on the load)
    tries: int = 40  # candidates measured on meta
    real_tries: int = 4  # candidates run for real
    search_seconds: float = 6.0  # the meta search, and then the real one, stop halving after this ...
    verify_runs: int = 18  # ... unless the real candidate held is so slow that the verification's runs of it
    real_search_seconds: float = 60.0  # (eager, float64 and ModelNew on 6 draws) cost more: then up to this
    real_elements: int = 2**26  # inputs larger than this are never built for real (256 MB in fp32)


@dataclass(frozen=True)
class Cost:
    """What one candidate costs; None where not measured. `complete` is False when measuring stopped early
    (too many ops, too slow, inputs too large to build): valid as far as it ran, and too large."""

    elements: int | None = None
    flops: int | None = None
    seconds: float | None = None
    complete: bool = True

    def excess(self, budget: Budget) -> float:
        """How far over budget, as a factor (<= 1: it fits)."""
        if not self.complete:
            return math.inf
        ratios = [v / cap for v, cap in ((self.elements, budget.elements), (self.flops, budget.flops),
                                         (self.seconds, budget.seconds)) if v is not None]
        return max(ratios, default=0.0)

    def fits(self, budget: Budget) -> bool:
        return self.excess(budget) <= 1.0


class _TooBig(Exception):
    """Raised inside a measured forward to stop it: the candidate is too large, not broken."""


# --- size constants -------------------------------------------------------------------------------------


def _leaves(value: Any) -> list[Any]:
    return [x for v in value for x in _leaves(v)] if isinstance(value, (list, tuple)) else [value]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _low(name: str) -> int:
    """The smallest value of `name` that is still halved."""
    return MIN_BATCH if name in BATCH_NAMES or "batch" in name.lower() else MIN_SIZE


def size_constants(problem: Problem) -> State:
    """The constants autosize may halve, with their values in the file: literal ints (or lists/tuples of ints)
    at module level, not derived from another name, not structural, large enough to be a size."""
    exprs = assignments(ast.parse(problem.source))
    consts = problem.constants()
    out: State = {}
    for name, expr in exprs.items():
        value = consts.get(name)
        leaves = _leaves(value)
        literal = not any(isinstance(n, ast.Name) for n in ast.walk(expr))
        if (literal and value is not None and all(map(_is_int, leaves)) and max(leaves) >= _low(name)
                and not STRUCTURAL.search(name)):
            out[name] = value
    return out


def halve(name: str, value: Any, times: int = 1) -> Any:
    """`value` with each of its sizes halved `times` times (lists and tuples element-wise, ints below the
    name's low mark kept); None where nothing changes."""
    def one(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return type(v)(one(x) for x in v)
        return v // 2 if v >= _low(name) else v

    out = value
    for _ in range(times):
        out = one(out)
    return None if out == value else out


def _largest(value: Any) -> int:
    return max(_leaves(value))


# --- measuring a candidate ------------------------------------------------------------------------------


def _batch_norm_shapes(args: tuple) -> tuple[torch.Tensor, ...]:
    """native_batch_norm's outputs on meta, made directly: torch's meta kernel for it takes ~20 ms a call
    whatever the size (2 s of DenseNet201's forward)."""
    x, weight, training = args[0], args[1], args[5]
    if weight is not None and weight.numel() != x.shape[1]:
        raise RuntimeError(f"batch_norm: {weight.numel()} weights for {x.shape[1]} channels")
    stats = x.shape[1] if training else 0
    return torch.empty_like(x), x.new_empty(stats), x.new_empty(stats)


class _Count(TorchDispatchMode):
    """Counts the elements of every tensor the forward makes (views excluded) and the ops it dispatches;
    stops a forward that dispatches too many or runs too long."""

    def __init__(self, budget: Budget) -> None:
        super().__init__()
        self.budget, self.elements, self.ops, self.start = budget, 0, 0, time.perf_counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.ops.aten.native_batch_norm.default and args[0].is_meta:
            out: Any = _batch_norm_shapes(args)
        else:
            out = func(*args, **(kwargs or {}))
        self.ops += 1
        if not getattr(func, "is_view", False):
            self.elements += _numel(_tensors(out))
        if self.ops > self.budget.ops or time.perf_counter() - self.start > self.budget.meta_seconds:
            raise _TooBig
        return out


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return []


def _numel(tensors: Any) -> int:
    return sum(t.numel() for t in tensors if isinstance(t, torch.Tensor))  # a forward may take numbers too


def conv_structure(model: torch.nn.Module) -> tuple[bool, ...]:
    """Which convolutions of `model` (in module order) have one input channel a group. Halving the channels of a
    grouped convolution down to one a group makes it depthwise, which kfuse runs on another tile or, transposed,
    leaves to torch (regions/conv_common.depthwise): the small instance would stand for another problem (KernelBench
    level 1 problem 72, 32 channels in 4 groups, came out as 4 in 4, and its convolution was left unfused)."""
    return tuple(m.groups > 1 and m.in_channels // m.groups == 1 for m in model.modules()
                 if isinstance(m, torch.nn.modules.conv._ConvNd))


def meta_cost(problem: Problem, budget: Budget, forward: bool = True,
              structure: tuple[bool, ...] | None = None) -> Cost:
    """Elements and flops of one forward on the meta device (without `forward`: of the parameters and inputs
    alone); raises whatever the model raises, and ValueError where the model's conv_structure is not `structure`
    (given)."""
    model = problem.build(device="meta")
    if structure is not None and conv_structure(model) != structure:
        raise ValueError("autosize: the candidate turns a grouped convolution depthwise")
    inputs = problem.inputs(device="meta")
    fixed = _numel(model.parameters()) + _numel(model.buffers()) + _numel(inputs)
    if not forward:
        return Cost(elements=fixed)
    counter = _Count(budget)
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as flops, counter:
            model(*inputs)
    except _TooBig:
        return Cost(complete=False)
    return Cost(elements=fixed + counter.elements, flops=flops.get_total_flops())


def real_cost(problem: Problem, budget: Budget) -> Cost:
    """Seconds of one eager forward on the CPU (the better of two calls where the first is slow but not hopeless:
    a first call sets things up), the only cost that counts for real; raises whatever the model raises. Inputs too
    large to build are not run."""
    if _numel(problem.inputs(device="meta")) > budget.real_elements:
        return Cost(complete=False)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        model, inputs = problem.build(), problem.inputs()
        seconds = math.inf
        for _ in range(2):
            start = time.perf_counter()
            model(*inputs)
            seconds = min(seconds, time.perf_counter() - start)
            if seconds <= budget.seconds or seconds > 5 * budget.seconds:
                break
    return Cost(seconds=seconds)


def _structure(problem: Problem) -> tuple[bool, ...] | None:
    """conv_structure of the file's own model on meta; None where it cannot be built there."""
    try:
        return conv_structure(problem.build(device="meta"))
    except Exception:  # noqa: BLE001 - a constructor that cannot run on meta: no structure to keep
        return None


def _measure(problem: Problem, state: State, how: str, budget: Budget,
             structure: tuple[bool, ...] | None = None) -> Cost | None:
    """The candidate's cost, or None where it is broken (the file, constructor, inputs or forward raise) or, given
    the file's `structure`, changes it (conv_structure). `how`: "meta" (a forward on meta), "static" (parameters and
    inputs on meta, no forward) or "real"."""
    try:
        candidate = problem.with_overrides(state)
        if how != "real":  # the structure is checked on the meta model meta_cost builds anyway
            return meta_cost(candidate, budget, how == "meta", structure)
        if structure is not None and conv_structure(candidate.build(device="meta")) != structure:
            return None
        return real_cost(candidate, budget)
    except Exception:  # noqa: BLE001 - a broken candidate is rejected, whatever it raised
        return None


# --- the search -----------------------------------------------------------------------------------------


def _steps(cost: Cost, budget: Budget, group: int) -> int:
    """Halvings to try at once: the excess in powers of two shared over the group (a cost grows at least with
    the product of the group's sizes), 2 where it is unknown, at most MAX_STEPS."""
    excess = cost.excess(budget)
    if math.isinf(excess):
        return 2
    return max(1, min(MAX_STEPS, int(math.log2(max(excess, 1.0)) // group)))


def _time_left(spent: float, held: Cost, budget: Budget) -> bool:
    """May the search try another candidate after `spent` seconds, holding a candidate that costs `held`? Yes
    within search_seconds; past them only while the held candidate's forward, measured for real, is so slow that
    the verification's `verify_runs` forwards of it would take longer than the search has so far (a halved
    candidate's try costs less than one of them), up to real_search_seconds. Both sides of that comparison are
    clock times on the same machine, so a busy machine does not cut the search short."""
    if spent < budget.search_seconds:
        return True
    slow = held.seconds is not None and held.seconds * budget.verify_runs > spent
    return slow and spent < budget.real_search_seconds


@dataclass
class _Memory:
    """What the search learnt, kept from the meta phase into the real one: candidates that raised (met again, in
    another mode, they fail at once), constants that break the model when halved, and the mode it is in."""

    failed: list[State] = field(default_factory=list)
    frozen: set[str] = field(default_factory=set)
    mode: str = "group"  # the largest constants and those within 2x of them; then "all" at once; then "single"
    structure: tuple[bool, ...] | None = None  # the file's conv_structure, which every candidate keeps


def _search(problem: Problem, start: State, cost: Cost, how: str, budget: Budget, tries: int,
            memory: _Memory) -> list[tuple[State, Cost]]:
    """Halve the largest live constants until the cost fits; the accepted candidates, largest first."""
    began = time.perf_counter()
    history = [(start, cost)]
    steps = 0  # 0: as many as the excess asks for
    while tries > 0 and not history[-1][1].fits(budget) and _time_left(time.perf_counter() - began,
                                                                        history[-1][1], budget):
        state, cost = history[-1]
        live = {n: v for n, v in state.items() if n not in memory.frozen and halve(n, v) is not None}
        if not live:
            break
        top = max(live, key=lambda n: _largest(live[n]))
        group = {"group": [n for n, v in live.items() if 2 * _largest(v) > _largest(live[top])],
                 "all": list(live), "single": [top]}[memory.mode]
        k = steps or _steps(cost, budget, len(group))
        trial = {**state, **{n: halve(n, state[n], k) for n in group}}
        new = None
        if trial not in memory.failed:
            tries -= 1
            new = _measure(problem, trial, how, budget, memory.structure)
            memory.failed += [trial] if new is None else []
        if new is not None:
            history.append((trial, new))
            steps = 0
        elif k > 1:
            steps = 1  # the same constants, one halving
        elif memory.mode != "single":
            memory.mode = "all" if memory.mode == "group" else "single"
        else:
            memory.frozen.add(top)
    return history


def _confirm(problem: Problem, history: list[tuple[State, Cost]], budget: Budget, memory: _Memory) -> State:
    """The smallest candidate that also runs for real, backing off to larger ones (never to the file's sizes,
    which may need gigabytes) where it raises; from there, halved further with real runs while slow. Where every
    one raises, the smallest: the error shows fast."""
    deadline = time.perf_counter() + budget.search_seconds
    for state, _ in reversed((history[1:] or history)[-budget.real_tries:]):
        cost = _measure(problem, state, "real", budget, memory.structure)
        if cost is not None:
            return _search(problem, state, cost, "real", budget, budget.real_tries, memory)[-1][0]
        memory.failed.append(state)
        if time.perf_counter() > deadline:
            break
    return history[-1][0]


CONDITION_SECONDS = 60.0  # spent on larger candidates where the smallest is too ill-conditioned to judge


def well_conditioned(problem: Problem, state: State) -> bool:
    """Does eager fp32 itself pass allclose(1e-4) against float64 at these sizes (one draw)? A deep network
    shrunk until BatchNorm normalizes two values (ResNet-101 at a batch of 2, 7 x 7 images) is 1.2 from float64
    in fp32: there the contract's rule 2 compares every candidate with float64 and no fp32 model can pass."""
    try:
        small = problem.with_overrides(state)
        torch.manual_seed(0)
        model = small.build()
        inputs = small.inputs()
        model64 = copy.deepcopy(model).double()
        with torch.no_grad():
            out = model(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
            ref = model64(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs])
        pairs = list(zip(_tensors(out), _tensors(ref)))
        # a quarter of the contract's tolerance: the verification's other draws must pass too
        return all(o.shape == r.shape and (not o.is_floating_point() or torch.allclose(o.double(), r, 2.5e-5, 2.5e-5))
                   for o, r in pairs)
    except Exception:  # noqa: BLE001 - a model the float64 run cannot take: nothing to learn here
        return True


def _doubled(value: Any, original: Any) -> Any:
    """Twice `value`, leaf by leaf, never past the file's own size."""
    if isinstance(value, (list, tuple)):
        return type(value)(_doubled(v, o) for v, o in zip(value, original))
    return min(2 * value, original) if _is_int(value) else value


def _conditioned(problem: Problem, chosen: State, sizes: State) -> State:
    """`chosen`, or it with every shrunk constant doubled (again, up to the file's sizes) until the contract can be
    decided there, within CONDITION_SECONDS; `chosen` where none can."""
    deadline = time.perf_counter() + CONDITION_SECONDS
    state = chosen
    while True:
        if well_conditioned(problem, state):
            return state
        bigger = {n: _doubled(v, sizes[n]) for n, v in state.items()}
        if bigger == state or time.perf_counter() > deadline:
            return chosen
        state = bigger


def choose_sizes(problem: Problem, budget: Budget = Budget()) -> State:
    """`--set` overrides that make `problem` small; empty where it is small already or nothing can be halved."""
    sizes = size_constants(problem)
    if not sizes:
        return {}
    memory = _Memory(structure=_structure(problem))
    for how in ("meta", "static"):  # a forward that cannot run on meta (reads values, or raises): sized by its tensors
        base = _measure(problem, sizes, how, budget)
        if base is not None:
            history = _search(problem, sizes, base, how, budget, budget.tries, memory)
            chosen = _confirm(problem, history, budget, memory)
            break
    else:  # a constructor that cannot run on meta (calls `.item()`): real runs throughout
        chosen = _search(problem, sizes, Cost(complete=False), "real", budget, 2 * budget.real_tries, memory)[-1][0]
    chosen = _conditioned(problem, chosen, sizes)
    return {n: v for n, v in chosen.items() if v != sizes[n]}


def describe(overrides: Mapping[str, Any]) -> str:
    """`batch_size=64 layer_sizes=[48,40]`: the --set flags that give the same instance."""
    return " ".join(f"{n}={v!r}".replace(" ", "") for n, v in overrides.items())
