"""Stage 7, verify: the accuracy contract of DESIGN.md, for kfuse's output and for anyone's candidate.

A candidate is correct when, on `trials` fresh random draws and at one extra shape (batch + 37):
  rule 1 `shape_dtype`: each output has the reference's shape and dtype, and no NaN/Inf where it has none;
  rule 2 `allclose`:    torch.allclose(out, ref, atol, rtol) (1e-4 each; 1e-2 for bf16), ref = eager fp32,
                        except for an output where eager itself fails that allclose against float64: there
                        ref = the float64 evaluation (decided per output and draw, see `compare`);
  rule 3 `float64_bound`: max|out - f64| <= 2 * max|eager - f64| + 1e-7, f64 = the model run in float64.
"Eager fp32" is strict: TF32 off for matmul and cuDNN. `kernelbench_allclose` records allclose against eager
under torch's default flags (cuDNN TF32 allowed), as KernelBench checks; it informs, it never decides.
Float buffers the forward updates (BatchNorm running statistics) are compared like outputs (a buffer equal to
eager's within the tolerance also passes rule 2 where eager's is not allclose to float64), integer
buffers (num_batches_tracked) exactly: a drop-in model must leave the same state behind.

The pieces are separate so that `kfuse eval` can run the candidate in another process:
`reference_run` gives the eager and float64 results of one draw, `compare` judges a candidate's results.
At full size the float64 evaluation and the copies are sized to the GPU's free memory (kfuse.memory).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from kfuse import memory
from kfuse.errors import KfuseError
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


@dataclass(frozen=True)
class BackendFlags:
    """The torch.backends switches that let fp32 run as TF32."""

    matmul_tf32: bool
    cudnn_tf32: bool

    @classmethod
    def current(cls) -> "BackendFlags":
        return cls(torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


STRICT = BackendFlags(False, False)  # eager fp32 as the contract means it
# Torch's flags as this process started: what KernelBench's reference runs under (cuDNN TF32 allowed).
DEFAULT_FLAGS = BackendFlags.current()


@contextlib.contextmanager
def backend_flags(flags: BackendFlags) -> Iterator[None]:
    prev = BackendFlags.current()
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags.matmul_tf32, flags.cudnn_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev.matmul_tf32, prev.cudnn_tf32


@dataclass
class Results:
    """What one forward call produced: flattened outputs, then the model's buffers after the call."""

    outputs: list[torch.Tensor]
    buffers: dict[str, torch.Tensor]


@dataclass
class Reference:
    """One random draw: its seed, the inputs (on the CPU), the strict eager and float64 results, and eager's
    outputs under torch's default flags (None where they are eager's: on the CPU, or the same bits).
    Results may wait in host memory (kfuse.memory.keep_on_device); `device` is where the draw ran."""

    seed: int
    inputs: list[torch.Tensor]
    eager: Results
    f64: Results
    kernelbench: list[torch.Tensor] | None = None
    device: str = "cpu"
    float64_run: str = "whole"  # how the float64 evaluation ran: "whole", "<n> slices" (of the batch) or "cpu"


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
    allclose_reference: str = ""  # rule 2's reference over this draw's tensors ("" where none was compared)
    kernelbench_allclose: bool = False  # every output allclose to eager under torch's default flags

    @property
    def ok(self) -> bool:
        return all(self.rules.values())


def combine_references(refs: Iterable[str]) -> str:
    """Rule 2's reference over several tensors or draws: "eager", "float64", or "mixed" (some of each)."""
    used = {r for r in refs if r}
    return used.pop() if len(used) == 1 else "mixed" if used else "eager"


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


def cast_inputs(inputs: Sequence[Any], device: str, dtype: torch.dtype) -> list[Any]:
    """Tensors on `device`, floats in `dtype`; a number get_inputs returned (`A * s`) is passed as it is."""
    return [(t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device))
            if isinstance(t, torch.Tensor) else t for t in inputs]


def fresh_inputs(inputs: Sequence[torch.Tensor], device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Copies of the inputs on `device`, floats in `dtype`: a model that writes into its inputs writes into
    these, and there is one copy, not a cast and then a clone."""
    return [t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype, copy=True)
            if isinstance(t, torch.Tensor) else t for t in inputs]


def _shape(t: Any) -> torch.Size:
    return t.shape if isinstance(t, torch.Tensor) else torch.Size()


FACTORIES = frozenset({torch.randn, torch.rand, torch.randn_like, torch.rand_like, torch.zeros, torch.ones,
                       torch.empty, torch.full, torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like,
                       torch.arange, torch.linspace, torch.tensor, torch.normal})


class Float64Factories(TorchFunctionMode):
    """During the float64 evaluation, fp32 tensors a forward makes itself (`h0 = torch.randn(...)`) come out as
    float64: drawn in fp32 as in eager (the same random numbers), then widened, so the float64 model can use them."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in FACTORIES and isinstance(out, torch.Tensor) and out.dtype == torch.float32:
            return out.double()
        return out


def call_model64(model: torch.nn.Module, inputs: Sequence[Any], seed: int) -> Results:
    with Float64Factories():
        return call_model(model, inputs, seed)


def call_model(model: torch.nn.Module, inputs: Sequence[torch.Tensor], seed: int) -> Results:
    """Call the model on `inputs` (which it may overwrite), with the RNG seeded (Dropout draws the same masks)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model(*inputs)
    return snapshot(model, out)


def run_model(model: torch.nn.Module, inputs: Sequence[torch.Tensor], seed: int) -> Results:
    """Call the model on fresh copies of the inputs, with the RNG seeded."""
    return call_model(model, [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs], seed)


# --- the reference results of one draw ------------------------------------------------------------------


def reference_run(problem: Problem, seed: int, device: str, precision: str = "fp32",
                  input_seed: int | None = None) -> tuple[Reference, torch.nn.Module]:
    """The strict eager result (in `precision`), the float64 result and eager's outputs under torch's default
    flags, for one draw; also a pristine copy of the eager model (the candidate's state comes from it).

    `input_seed` (default: `seed`) draws the inputs apart from the model, so one model instance can be
    judged on several fresh draws (`kfuse eval` does this to catch results cached across calls).
    On a GPU, an eager model that does not fit is a KfuseError (one line, exit 2)."""
    dtype = DTYPES[precision]
    gpu = torch.device(device).type == "cuda"
    free = memory.device_free(device)
    if free is not None:
        too_big = memory.eager_too_big(problem.path, memory.meta_estimate(problem, dtype).total, free)
        if too_big:
            raise KfuseError(too_big)
    original = seeded_build(problem, seed, device=device)
    # the inputs are kept on the CPU, as drawn before models were built on the device: the judge ships them to
    # its worker and compares what comes back bit for bit; each run gets its own device copy
    drawn = seeded_inputs(problem, seed if input_seed is None else input_seed, device=device)
    inputs = [t.cpu() if isinstance(t, torch.Tensor) else t for t in drawn]
    pristine = copy.deepcopy(original).to(dtype=dtype)
    try:
        eager, need = _eager_run(copy.deepcopy(pristine), inputs, device, dtype, seed, STRICT)
    except torch.cuda.OutOfMemoryError:
        eager = None
    if eager is None:  # outside the handler: its traceback holds the failed run's tensors
        raise KfuseError(f"{problem.path}: the eager model ran out of GPU memory: it needs more than the "
                         f"{memory.gb(free or 0)} GB the GPU had free")
    kernelbench = None
    if gpu and DEFAULT_FLAGS != STRICT:
        eager = _park(eager, device, need)
        kb, _ = _eager_run(copy.deepcopy(pristine), inputs, device, dtype, seed, DEFAULT_FLAGS)
        same = all(a.shape == b.shape and torch.equal(a, b.to(a.device)) for a, b in zip(kb.outputs, eager.outputs))
        kernelbench = None if same else kb.outputs
    need64 = need.widened(memory.float64_factor(dtype))
    eager = _park(eager, device, need64)
    if kernelbench is not None:
        kernelbench = _park(Results(kernelbench, {}), device, need64).outputs
    f64, how = _float64_run(problem, original, pristine, inputs, eager, need64, device, precision, seed)
    del original
    parked = [_park(r, device, need) for r in (eager, f64, Results(kernelbench or [], {}))]
    ref = Reference(seed=seed, inputs=inputs, eager=parked[0], f64=parked[1],
                    kernelbench=parked[2].outputs if kernelbench is not None else None, device=device,
                    float64_run=how)
    return ref, pristine


def _eager_run(model: torch.nn.Module, inputs: Sequence[torch.Tensor], device: str, dtype: torch.dtype, seed: int,
               flags: BackendFlags) -> tuple[Results, memory.DrawBytes]:
    """One eager call under `flags`, and the bytes it needed (on a GPU: the measured peak of the forward)."""
    xs = fresh_inputs(inputs, device, dtype)
    model_b, inputs_b = memory.module_bytes(model), memory.tensor_bytes(xs)
    gpu = torch.device(device).type == "cuda"
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    with backend_flags(flags):
        res = call_model(model, xs, seed)
    out_b = memory.tensor_bytes(res.outputs)
    peak = torch.cuda.max_memory_allocated(device) - base if gpu else out_b
    return res, memory.DrawBytes(model_b, inputs_b, out_b, max(peak, out_b))


def _results_bytes(res: Results) -> int:
    return memory.tensor_bytes(t for t in [*res.outputs, *res.buffers.values()] if t.device.type != "cpu")


def _park(res: Results, device: str, need_next: memory.DrawBytes) -> Results:
    """`res` on the device while it is small and the next run (`need_next`) fits beside it; else in host memory."""
    nbytes = _results_bytes(res)
    if nbytes == 0 or memory.keep_on_device(nbytes, memory.device_free(device), need_next.total):
        return res
    return Results([o.cpu() for o in res.outputs], {k: b.cpu() for k, b in res.buffers.items()})


def _float64_run(problem: Problem, original: torch.nn.Module, pristine: torch.nn.Module,
                 inputs: Sequence[torch.Tensor], eager: Results, need64: memory.DrawBytes, device: str,
                 precision: str, seed: int) -> tuple[Results, str]:
    """The model in float64 on this draw, by the first of memory.plan_float64's attempts that fits: whole on the
    device, in slices of the batch, or on the CPU (and which it was). `original` (the model as built) is
    converted in place."""
    batch = _sliceable_batch(problem, original, inputs, eager)
    attempts = memory.plan_float64(need64, memory.device_free(device), batch)
    slice_ok: bool | None = None  # checked once, where a sliced attempt comes up
    last_error = ""
    for plan in attempts:
        if plan.slices > 1:
            if slice_ok is None:
                slice_ok = _last_slice_agrees(pristine, inputs, eager, batch, plan.slices, device, precision, seed)
            if not slice_ok:
                continue
        where = device if plan.on_device else "cpu"
        model64 = original.to(device=where, dtype=torch.float64)
        try:
            if plan.slices > 1:
                return _sliced_call(model64, inputs, batch, plan.slices, where, seed), f"{plan.slices} slices"
            how = "whole" if plan.on_device else "cpu"
            return call_model64(model64, fresh_inputs(inputs, where, torch.float64), seed), how
        except torch.cuda.OutOfMemoryError as err:
            last_error = str(err).splitlines()[0] if str(err) else "out of memory"
        memory.device_free(device)  # the failed attempt's blocks, before the next plan
    raise KfuseError(f"{problem.path}: the float64 evaluation does not fit ({last_error})")


def _sliceable_batch(problem: Problem, model: torch.nn.Module, inputs: Sequence[torch.Tensor],
                     eager: Results) -> int | None:
    """The batch size where the float64 evaluation may be sliced along it (memory.slicing_blocked), else None."""
    name = problem.batch_constant()
    batch = int(problem.constants()[name]) if name else None
    changed = any(not torch.equal(b.cpu(), eager.buffers[k].cpu()) for k, b in model.named_buffers()
                  if k in eager.buffers)
    blocked = memory.slicing_blocked(model, [_shape(t) for t in inputs], [o.shape for o in eager.outputs], batch,
                                     changed)
    return None if blocked else batch


def _slice_inputs(inputs: Sequence[torch.Tensor], batch: int, a: int, b: int) -> list[torch.Tensor]:
    rows = memory.batch_rows([_shape(t) for t in inputs], batch)
    return [t[a:b] if r else t for t, r in zip(inputs, rows)]


def _last_slice_agrees(pristine: torch.nn.Module, inputs: Sequence[torch.Tensor], eager: Results, batch: int,
                       slices: int, device: str, precision: str, seed: int) -> bool:
    """Does eager, run on the last slice of the batch alone, give eager's rows of the whole batch (to rule 2's
    tolerance)? A forward that mixes rows without a module showing it (x - x.mean(0)) fails here."""
    a, b = memory.slice_bounds(batch, slices)[-1]
    dtype, tol = DTYPES[precision], TOLERANCES[precision]
    try:
        with backend_flags(STRICT):
            part = call_model(copy.deepcopy(pristine), fresh_inputs(_slice_inputs(inputs, batch, a, b), device, dtype),
                              seed)
        return len(part.outputs) == len(eager.outputs) and all(
            p.shape == e[a:b].shape and torch.allclose(p, e[a:b].to(p.device), atol=tol.atol, rtol=tol.rtol)
            for p, e in zip(part.outputs, eager.outputs))
    except Exception:  # noqa: BLE001 - a slice the forward rejects (a size read from a constant) is not sliceable
        return False


def _sliced_call(model64: torch.nn.Module, inputs: Sequence[torch.Tensor], batch: int, slices: int, device: str,
                 seed: int) -> Results:
    """The float64 model on `slices` pieces of the batch in turn, each piece's outputs copied into host memory."""
    outputs: list[torch.Tensor] = []
    for a, b in memory.slice_bounds(batch, slices):
        part = call_model64(model64, fresh_inputs(_slice_inputs(inputs, batch, a, b), device, torch.float64), seed)
        if not outputs:
            outputs = [torch.empty((batch, *o.shape[1:]), dtype=o.dtype) for o in part.outputs]
        for whole, o in zip(outputs, part.outputs):
            whole[a:b].copy_(o)
        del part
    return Results(outputs, {k: b.detach().clone() for k, b in model64.named_buffers()})


# --- judging a candidate ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairStats:
    """One candidate tensor against its references, in one pass over chunks (kfuse.memory.paired_chunks)."""

    finite: bool  # no NaN/Inf in the candidate where eager has none
    close_eager: bool  # allclose(candidate, eager)
    close_f64: bool  # allclose(candidate, float64)
    eager_close_f64: bool  # allclose(eager, float64): whether rule 2 may use eager
    close_kernelbench: bool  # allclose(candidate, eager under torch's default flags)
    diff_eager: float
    err: float  # candidate vs float64
    ref_err: float  # eager vs float64


def _nanmax(a: float, b: float) -> float:
    return a if math.isnan(a) else b if math.isnan(b) else max(a, b)


def pair_stats(c: torch.Tensor, e: torch.Tensor, f: torch.Tensor, k: torch.Tensor | None, tol: Tolerance) -> PairStats:
    """Compare where one of them is on a GPU (pieces of the others are copied there), else on the CPU.
    Candidate-vs-eager checks run in their own dtype, as torch.allclose does; anything against float64 in
    float64."""
    tensors = [c, e, f] if k is None else [c, e, f, k]
    where = next((t.device for t in tensors if t.device.type != "cpu"), torch.device("cpu"))
    finite = close_e = close_f = e_close_f = close_k = True
    diff = err = ref_err = 0.0
    if c.numel() == 0:
        return PairStats(True, True, True, True, True, 0.0, 0.0, 0.0)
    for pieces in memory.paired_chunks(tensors):
        cc, ec, fc, *kc = (p.to(where) for p in pieces)
        finite &= bool((torch.isfinite(cc) | ~torch.isfinite(ec)).all())
        close_e &= bool(torch.isclose(cc, ec, rtol=tol.rtol, atol=tol.atol).all())
        close_k &= bool(torch.isclose(cc, kc[0], rtol=tol.rtol, atol=tol.atol).all()) if kc else close_e
        c64, e64, f64 = cc.double(), ec.double(), fc.double()
        close_f &= bool(torch.isclose(c64, f64, rtol=tol.rtol, atol=tol.atol).all())
        e_close_f &= bool(torch.isclose(e64, f64, rtol=tol.rtol, atol=tol.atol).all())
        diff = _nanmax(diff, float((c64 - e64).abs().max()))
        err = _nanmax(err, float((c64 - f64).abs().max()))
        ref_err = _nanmax(ref_err, float((e64 - f64).abs().max()))
    return PairStats(finite, close_e, close_f, e_close_f, close_k, diff, err, ref_err)


def compare(cand: Results, ref: Reference, tol: Tolerance, shape: str = "") -> Verdict:
    """Apply rules 1-3 to every output and float buffer, and exact equality to integer buffers.

    Rule 2's reference is decided per tensor: eager, or float64 where eager itself is not allclose to float64
    (its own rounding exceeds the tolerance). The verdict's `allclose_reference` names the one used, "mixed"
    where the tensors of this draw used both."""
    rules = dict.fromkeys(RULES, True)
    failures: list[str] = []
    err = ref_err = diff = 0.0
    used: list[str] = []

    def fail(rule: str, text: str) -> None:
        rules[rule] = False
        failures.append(f"{rule}: {text}")

    if len(cand.outputs) != len(ref.eager.outputs):
        fail("shape_dtype", f"{len(cand.outputs)} outputs, reference has {len(ref.eager.outputs)}")
        return Verdict(ref.seed, shape, rules, float("inf"), 0.0, float("inf"), failures)

    kernelbench = ref.kernelbench if ref.kernelbench is not None else [None] * len(ref.eager.outputs)
    pairs = [(f"output {i}", c, e, f, k)
             for i, (c, e, f, k) in enumerate(zip(cand.outputs, ref.eager.outputs, ref.f64.outputs, kernelbench))]
    for name, e in ref.eager.buffers.items():
        c, f = cand.buffers.get(name), ref.f64.buffers[name]
        if c is None:
            fail("buffers", f"buffer {name} missing")
        elif not e.is_floating_point():
            if not torch.equal(c.cpu(), e.cpu()):
                fail("buffers", f"buffer {name} is {c.tolist()}, expected {e.tolist()}")
        else:
            pairs.append((f"buffer {name}", c, e, f, None))

    kb_ok = True  # KernelBench compares outputs only
    for name, c, e, f, k in pairs:
        is_output = name.startswith("output")
        rule_close = "allclose" if is_output else "buffers"
        rule_bound = "float64_bound" if is_output else "buffers"
        if c.shape != e.shape or c.dtype != e.dtype:
            fail("shape_dtype", f"{name} is {c.dtype} {tuple(c.shape)}, expected {e.dtype} {tuple(e.shape)}")
            err, kb_ok = float("inf"), kb_ok and not is_output
            continue
        s = pair_stats(c, e, f, k, tol)
        kb_ok = kb_ok and (s.close_kernelbench or not is_output)
        if not s.finite:
            fail("shape_dtype", f"{name} has NaN/Inf where the reference has none")
            err = float("inf")
            continue
        diff, err, ref_err = _nanmax(diff, s.diff_eager), _nanmax(err, s.err), _nanmax(ref_err, s.ref_err)
        reference = "eager" if s.eager_close_f64 else "float64"
        used.append(reference)
        if reference == "eager" and not s.close_eager:
            fail(rule_close, f"{name} not allclose to eager (max abs diff {s.diff_eager:.3g}, "
                             f"atol={tol.atol}, rtol={tol.rtol})")
        elif reference == "float64" and not s.close_f64 and (is_output or not s.close_eager):
            # a buffer may also match eager's: the state eager leaves behind is a drop-in's by definition (a deep
            # net's BatchNorm running variance carries fp32 rounding that no fp32 model avoids; ResNet101: 0.065)
            fail(rule_close, f"{name} not allclose to float64, the reference where eager is not (max abs err "
                             f"{s.err:.3g}, eager's {s.ref_err:.3g}, atol={tol.atol}, rtol={tol.rtol})")
        bound = tol.factor * s.ref_err + tol.slack
        if not s.err <= bound:
            fail(rule_bound, f"{name} error vs float64 {s.err:.3g} > {tol.factor:g} x eager's {s.ref_err:.3g} "
                             f"+ {tol.slack:g}")
    return Verdict(ref.seed, shape, rules, err, ref_err, diff, failures, combine_references(used), kb_ok)


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
    allclose_reference: str = "eager"  # rule 2's reference over every draw: "eager", "float64" or "mixed"
    kernelbench_allclose: bool = False  # every draw at the given sizes allclose to default-flags eager

    @property
    def failures(self) -> list[str]:
        return [f"seed {v.seed}{' at ' + v.shape if v.shape else ''}: {f}" for v in self.verdicts for f in v.failures]


def kernelbench_allclose(verdicts: Sequence[Verdict]) -> bool:
    """KernelBench's verdict: its draws are at the given sizes only."""
    given = [v for v in verdicts if not v.shape]
    return bool(given) and all(v.kernelbench_allclose for v in given)


def extra_shape_problem(problem: Problem) -> tuple[Problem | None, str | None]:
    """The same problem with the batch constant raised by 37, or
    (None, None) where it names no batch."""
    batch = problem.batch_constant()
    if batch is None:
        return None, None
    given = int(problem.constants()[batch])
    value = given + EXTRA_BATCH
    return problem.with_overrides({batch: value}), f"{batch}={value}"


CandidateRunner = Callable[[Problem, Reference, torch.nn.Module], Results]


def run_in_process(cand_cls: type) -> CandidateRunner:
    """A runner that builds the candidate here under the draw's seed and loads the eager model's state."""

    def runner(problem: Problem, ref: Reference, pristine: torch.nn.Module) -> Results:
        # the candidate file carries the problem's source with its own constants; a constructor that reads one
        # (`torch.randn(batch_size, hidden)` in __init__) must see this instance's, as Model did
        globals_ = getattr(cand_cls.__init__, "__globals__", None)
        if isinstance(globals_, dict):
            globals_.update(problem.constants())
        device = ref.device
        cand = seeded_build(problem, ref.seed, cand_cls, device=device)
        cand.load_state_dict(pristine.state_dict(), strict=True)
        first = next(iter(pristine.parameters()), None)
        dtype = first.dtype if first is not None else torch.float32
        cand = cand.to(device=device, dtype=dtype)
        return call_model(cand, fresh_inputs(ref.inputs, device, dtype), ref.seed)

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
    cases: list[tuple[Problem, int, str]] = [(problem, seed + i, "") for i in range(trials)]
    extra_label = None
    if extra_shape:
        extra, extra_label = extra_shape_problem(problem)
        if extra is not None:
            cases.append((extra, seed + trials, extra_label or ""))
    # one draw at a time: its reference, the candidate's results and the verdict, freed before the next
    verdicts = []
    for prob, s, label in cases:
        try:
            verdicts.append(judge_draw(prob, s, label, runner, device, precision))
        except Exception:  # noqa: BLE001 - the problem's own model fails at the extra shape: not checkable there
            if not label:  # (batch + 37 where another constant must equal the batch: level 1 problem 100)
                raise
            extra_label = None
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
        allclose_reference=combine_references(v.allclose_reference for v in verdicts),
        kernelbench_allclose=kernelbench_allclose(verdicts),
    )


def judge_draw(problem: Problem, seed: int, label: str, runner: CandidateRunner, device: str,
               precision: str) -> Verdict:
    ref, pristine = reference_run(problem, seed, device, precision)
    try:
        cand = runner(problem, ref, pristine)
    except Exception as err:  # noqa: BLE001 - a crashing candidate is a failed verdict, not a crash of ours
        return Verdict(seed, label, dict.fromkeys(RULES, False), float("inf"), 0.0, float("inf"),
                       [f"candidate raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"])
    del pristine  # the candidate's model is built; its state came from here
    return compare(cand, ref, TOLERANCES[precision], label)
