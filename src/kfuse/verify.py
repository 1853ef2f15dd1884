"""Stage 7, verify: the accuracy contract of DESIGN.md, for kfuse's output and for anyone's candidate.

A candidate is correct when, on `trials` fresh random draws and at one extra shape (batch + 37):
  rule 1 `shape_dtype`: each output has the reference's shape and dtype, and no NaN/Inf where it has none;
  rule 2 `allclose`:    torch.allclose(out, eager_fp32, atol, rtol)   (1e-4 each; 1e-2 for bf16);
  rule 3 `float64_bound`: max|out - f64| <= 2 * max|eager - f64| + 1e-7, f64 = the model run in float64.
Float buffers the forward updates (BatchNorm running statistics) are compared like outputs, integer
buffers (num_batches_tracked) exactly: a drop-in model must leave the same state behind.

The pieces are separate so that `kfuse eval` can run the candidate in another process:
`reference_run` gives the eager and float64 results of one draw, `compare` judges a candidate's results.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kfuse.load import Problem

RULES = ("shape_dtype", "allclose", "float64_bound", "buffers")
EXTRA_BATCH = 37


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    factor: float = 2.0  # rule 3: at most this many times eager's own error against float64 ...
    slack: float = 1e-7  # ... plus this


TOLERANCES = {"fp32": Tolerance(1e-4, 1e-4), "bf16": Tolerance(1e-2, 1e-2)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Results:
    """What one forward call produced: flattened outputs, then the model's buffers after the call."""

    outputs: list[torch.Tensor]
    buffers: dict[str, torch.Tensor]


@dataclass
class Reference:
    """One random draw: its seed, the inputs, and the eager and float64 results."""

    seed: int
    inputs: list[torch.Tensor]
    eager: Results
    f64: Results


@dataclass
class Verdict:
    """The judgement of one candidate run against one Reference."""

    seed: int
    shape: str
    rules: dict[str, bool]
    max_abs_err: float  # candidate vs float64, over outputs and float buffers
    ref_max_abs_err: float  # eager vs float64
    max_abs_diff_eager: float  # candidate vs eager
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(self.rules.values())


def flatten(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flatten(o)]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in flatten(out[k])]
    raise TypeError(f"output of type {type(out).__name__} is not a tensor")


def snapshot(model: torch.nn.Module, out: Any) -> Results:
    return Results(
        outputs=[o.detach() for o in flatten(out)],
        buffers={k: b.detach().clone() for k, b in model.named_buffers()},
    )


def seeded_build(problem: Problem, seed: int, cls: type | None = None, device: str | None = None) -> torch.nn.Module:
    """The model under `seed`, its parameters created on `device` (a draw is only ever compared with draws
    built the same way, so where the random numbers come from does not matter; a GPU makes them fast)."""
    torch.manual_seed(seed)
    return problem.build(problem.init_inputs(), cls, device=device)


def seeded_inputs(problem: Problem, seed: int, device: str | None = None) -> list[torch.Tensor]:
    torch.manual_seed(seed + 1_000_003)
    return problem.inputs(device=device)


def cast_inputs(inputs: Sequence[torch.Tensor], device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    return [t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device) for t in inputs]


def run_model(model: torch.nn.Module, inputs: Sequence[torch.Tensor], seed: int) -> Results:
    """Call the model on fresh clones of the inputs, with the RNG seeded (Dropout draws the same masks)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model(*[t.clone() for t in inputs])
    return snapshot(model, out)


def reference_run(problem: Problem, seed: int, device: str, precision: str = "fp32",
                  input_seed: int | None = None) -> tuple[Reference, torch.nn.Module]:
    """The eager result (in `precision`) and the float64 result of one draw; also the fresh eager model.

    `input_seed` (default: `seed`) draws the inputs apart from the model, so one model instance can be
    judged on several fresh draws (`kfuse eval` does this to catch results cached across calls)."""
    model = seeded_build(problem, seed, device=device)
    inputs = seeded_inputs(problem, seed if input_seed is None else input_seed, device=device)
    f64_model = copy.deepcopy(model).to(device=device, dtype=torch.float64)
    pristine = copy.deepcopy(model).to(device=device, dtype=DTYPES[precision])
    eager_model = model.to(device=device, dtype=DTYPES[precision])
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # eager fp32 means fp32: the reference we must match
    try:
        eager = run_model(eager_model, cast_inputs(inputs, device, DTYPES[precision]), seed)
        f64 = run_model(f64_model, cast_inputs(inputs, device, torch.float64), seed)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    # the inputs are kept on the CPU, as drawn before models were built on the device: the judge ships them to
    # its worker and compares what comes back bit for bit
    return Reference(seed=seed, inputs=[t.cpu() for t in inputs], eager=eager, f64=f64), pristine


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max())


def compare(cand: Results, ref: Reference, tol: Tolerance, shape: str = "") -> Verdict:
    """Apply rules 1-3 to every output and float buffer, and exact equality to integer buffers."""
    rules = dict.fromkeys(RULES, True)
    failures: list[str] = []
    err = ref_err = diff = 0.0

    def fail(rule: str, text: str) -> None:
        rules[rule] = False
        failures.append(f"{rule}: {text}")

    if len(cand.outputs) != len(ref.eager.outputs):
        fail("shape_dtype", f"{len(cand.outputs)} outputs, reference has {len(ref.eager.outputs)}")
        return Verdict(ref.seed, shape, rules, float("inf"), 0.0, float("inf"), failures)

    pairs = [(f"output {i}", c, e, f) for i, (c, e, f) in enumerate(zip(cand.outputs, ref.eager.outputs, ref.f64.outputs))]
    for name, e in ref.eager.buffers.items():
        c, f = cand.buffers.get(name), ref.f64.buffers[name]
        if c is None:
            fail("buffers", f"buffer {name} missing")
        elif not e.is_floating_point():
            if not torch.equal(c.cpu(), e.cpu()):
                fail("buffers", f"buffer {name} is {c.tolist()}, expected {e.tolist()}")
        else:
            pairs.append((f"buffer {name}", c, e, f))

    for name, c, e, f in pairs:
        rule_close = "buffers" if name.startswith("buffer") else "allclose"
        rule_bound = "buffers" if name.startswith("buffer") else "float64_bound"
        if c.shape != e.shape or c.dtype != e.dtype:
            fail("shape_dtype", f"{name} is {c.dtype} {tuple(c.shape)}, expected {e.dtype} {tuple(e.shape)}")
            err = float("inf")
            continue
        c, e, f = c.to(e.device), e, f.to(e.device)
        if not bool((torch.isfinite(c) | ~torch.isfinite(e)).all()):
            fail("shape_dtype", f"{name} has NaN/Inf where the reference has none")
            err = float("inf")
            continue
        d_eager, d_c, d_e = _max_abs(c, e), _max_abs(c, f), _max_abs(e, f)
        diff, err, ref_err = max(diff, d_eager), max(err, d_c), max(ref_err, d_e)
        if not torch.allclose(c, e, atol=tol.atol, rtol=tol.rtol):
            fail(rule_close, f"{name} not allclose to eager (max abs diff {d_eager:.3g}, atol={tol.atol}, rtol={tol.rtol})")
        bound = tol.factor * d_e + tol.slack
        if not d_c <= bound:
            fail(rule_bound, f"{name} error vs float64 {d_c:.3g} > {tol.factor:g} x eager's {d_e:.3g} + {tol.slack:g}")
    return Verdict(ref.seed, shape, rules, err, ref_err, diff, failures)


@dataclass
class ContractReport:
    correct: bool
    rules: dict[str, bool | None]
    max_abs_err: float
    ref_max_abs_err: float
    max_abs_diff_eager: float
    trials: int
    extra_shape: str | None
    verdicts: list[Verdict]

    @property
    def failures(self) -> list[str]:
        return [f"seed {v.seed}{' at ' + v.shape if v.shape else ''}: {f}" for v in self.verdicts for f in v.failures]


def extra_shape_problem(problem: Problem) -> tuple[Problem | None, str | None]:
    """The same problem with the batch constant raised by 37, or (None, None) where it names no batch."""
    batch = problem.batch_constant()
    if batch is None:
        return None, None
    value = int(problem.constants()[batch]) + EXTRA_BATCH
    return problem.with_overrides({batch: value}), f"{batch}={value}"


CandidateRunner = Callable[[Problem, Reference, torch.nn.Module], Results]


def run_in_process(cand_cls: type) -> CandidateRunner:
    """A runner that builds the candidate here under the draw's seed and loads the eager model's state."""

    def runner(problem: Problem, ref: Reference, pristine: torch.nn.Module) -> Results:
        device = ref.eager.outputs[0].device.type
        cand = seeded_build(problem, ref.seed, cand_cls, device=device)
        cand.load_state_dict(pristine.state_dict(), strict=True)
        first = next(iter(pristine.parameters()), None)
        dtype = first.dtype if first is not None else torch.float32
        cand = cand.to(device=device, dtype=dtype)
        return run_model(cand, cast_inputs(ref.inputs, device, dtype), ref.seed)

    return runner


def check_contract(
    problem: Problem,
    runner: CandidateRunner,
    *,
    device: str,
    precision: str = "fp32",
    trials: int = 5,
    seed: int = 0,
    extra_shape: bool = True,
) -> ContractReport:
    tol = TOLERANCES[precision]
    cases: list[tuple[Problem, int, str]] = [(problem, seed + i, "") for i in range(trials)]
    extra_label = None
    if extra_shape:
        extra, extra_label = extra_shape_problem(problem)
        if extra is not None:
            cases.append((extra, seed + trials, extra_label or ""))
    verdicts = []
    for prob, s, label in cases:
        ref, pristine = reference_run(prob, s, device, precision)
        try:
            cand = runner(prob, ref, pristine)
        except Exception as err:  # noqa: BLE001 - a crashing candidate is a failed verdict, not a crash of ours
            v = Verdict(s, label, dict.fromkeys(RULES, False), float("inf"), 0.0, float("inf"),
                        [f"candidate raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"])
            verdicts.append(v)
            continue
        verdicts.append(compare(cand, ref, tol, label))
    rules = {r: all(v.rules[r] for v in verdicts) for r in RULES}
    # None: not checked (the problem names no batch constant to grow).
    rules["extra_shape"] = all(v.ok for v in verdicts if v.shape) if extra_label else None
    return ContractReport(
        correct=all(v.ok for v in verdicts) and bool(verdicts),
        rules=rules,
        max_abs_err=max(v.max_abs_err for v in verdicts),
        ref_max_abs_err=max(v.ref_max_abs_err for v in verdicts),
        max_abs_diff_eager=max(v.max_abs_diff_eager for v in verdicts),
        trials=len(verdicts),
        extra_shape=extra_label,
        verdicts=verdicts,
    )
