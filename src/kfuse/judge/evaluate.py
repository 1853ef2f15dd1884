"""One (REF, CANDIDATE) pair -> an `EvalRecord` (-> JSON).

The judge reads REF once (into a folder only it can see) and computes every reference result of every
shape (verify.reference_run: eager in the chosen precision and float64) before the candidate starts. Its
worker process starts meanwhile (sandbox, torch, on the GPU CUDA and CUPTI), so those seconds overlap the
references, but it is handed the candidate's code only once they all exist. The candidate lives in a
sandboxed worker process (sandbox.py, ipc.py, worker.py) that receives inputs and a model seed, and sends back
outputs; it never sees a reference, an input seed or the base seed. Per shape the candidate is built once and
called on fresh input draws, so a result cached across calls fails; its state is reset before each call so
buffers (BatchNorm statistics) match a fresh reference.

Shapes: the problem as given (`trials` draws), the batch changed and, where the file names feature sizes the
reference accepts changed, those changed (one draw each), each by an odd step drawn per run from the base
seed: kernels must mask, not specialize.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
import secrets
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kfuse.errors import KfuseError, ProblemError
from kfuse.judge import cache, cheats, sandbox
from kfuse.judge.clock import GATE, ClockConfig, time_outside
from kfuse.judge.ipc import ANSWER_FLOOR_BYTES, WorkerFailure, WorkerHandle, clean_text, tensor_bytes
from kfuse.judge.worker import INLINE_GO, INLINE_NEXT
from kfuse.load import Problem, load_problem
from kfuse.timing import timing_unavailable
from kfuse.verify import (
    DTYPES,
    RULES,
    TOLERANCES,
    Reference,
    Results,
    Verdict,
    cast_inputs,
    combine_references,
    compare,
    flatten,
    kernelbench_allclose,
    reference_run,
    seeded_build,
    seeded_inputs,
)

FEATURE_NAME = re.compile(r"(features|channels|hidden\w*|_dim|^dim|embed\w*|d_model)$")
# The references seed torch's global RNG: evaluations that run side by side (threads) take turns.
_REFERENCE_LOCK = threading.Lock()


@dataclass(frozen=True)
class EvalConfig:
    device: str = "cpu"
    precision: str = "fp32"
    trials: int = 5
    perf_trials: int = 100
    warmup: int = 5
    timeout_s: float = 300.0  # the candidate from its hand-over: import, every call, timing; the worker's start too
    seed: int | None = None  # None: drawn at random (and recorded), so no candidate can know it
    overrides: Mapping[str, int | float] = field(default_factory=dict)
    extra_shapes: bool = True
    compile_baseline: bool = True
    time_on_cpu: bool = False  # time by the judge's clock on the CPU too (tests of the protocol; not a speed)
    timed_checks: int = 2  # timed calls checked per batch, picked after they ran (and the batch's last)
    compile_cache: bool = True  # keep each file's Triton/load_inline/Inductor cache (by its hash) across runs
    cache_references: bool = True  # reuse reference results of the same file, shape and seeds (cache.py)
    sandboxed: bool = True  # False only on the user's explicit --unsandboxed; the record says so
    limits: sandbox.Limits = sandbox.Limits()  # kernel limits on the worker (machine defaults where None)


@dataclass
class EvalRecord:
    """What `kfuse eval` reports; `to_json()` is the documented JSON (docs/eval.md)."""

    problem: str
    ref: str
    candidate: str
    device: str
    precision: str
    seed: int
    sandbox: str = "bwrap"  # "bwrap", or "none (--unsandboxed)"
    compiled: bool = False
    correct: bool = False
    flags: list[str] = field(default_factory=list)
    flag_details: dict[str, str] = field(default_factory=dict)
    max_abs_err: float | None = None
    ref_max_abs_err: float | None = None
    max_abs_diff_eager: float | None = None
    allclose_reference: str | None = None
    kernelbench_allclose: bool | None = None
    rules: dict[str, bool | None] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    shapes: list[str] = field(default_factory=list)
    trials: int = 0
    runtime_ms: float | None = None
    ref_runtime_ms: float | None = None
    compile_runtime_ms: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    timing: dict[str, Any] = field(default_factory=dict)
    triton_launches: int = 0
    kernels: list[str] = field(default_factory=list)  # the candidate's own kernels (GPU: from the profiler)
    library_kernels: list[str] = field(default_factory=list)  # GPU: library/torch kernels the profiler saw
    kernel_count_source: str = "triton_launches"  # "profiler" on the GPU
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    elapsed_s: float = 0.0
    phases_s: dict[str, float] = field(default_factory=dict)  # references, worker_ready_wait, import, ...

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))


def _jsonable(obj: Any) -> Any:
    """Strict JSON: NaN -> null, inf -> "inf"."""
    if isinstance(obj, float):
        return None if math.isnan(obj) else ("inf" if obj == math.inf else "-inf" if obj == -math.inf else obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


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


def prepare(problem: Problem, seed: int, cfg: "EvalConfig", record: "EvalRecord",
            ref_sha256: str) -> list[PlannedShape]:
    """Every shape's references, from the one snapshot of REF, before any candidate code runs."""
    planned = []
    for shape in plan_shapes(problem, seed, cfg.trials, cfg.extra_shapes):
        try:
            with _REFERENCE_LOCK:
                planned.append(references(shape, cfg, ref_sha256))
        except Exception as err:  # noqa: BLE001 - only extra shapes get here: the given one already ran
            if not shape.label:
                raise KfuseError(f"{record.ref}: the reference fails on its own inputs ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0] if str(err) else ''})") from None
            record.notes.append(f"extra shape {shape.label} skipped: the reference fails there ({type(err).__name__})")
    return planned


def references(shape: Shape, cfg: "EvalConfig", ref_sha256: str) -> PlannedShape:
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


# --- the evaluation -----------------------------------------------------------------------------------


def check_paths(ref: Path, candidate: Path) -> None:
    """Usage errors (exit 2): the candidate file must exist and be Python; REF is checked by load_problem."""
    if not candidate.is_file():
        raise KfuseError(f"{candidate}: candidate file not found")
    if candidate.suffix != ".py":
        raise KfuseError(f"{candidate}: not a Python file (expected a file defining ModelNew)")


def sandbox_refusal() -> str | None:
    reason = sandbox.unavailable()
    if reason is None:
        return None
    return (f"the candidate sandbox cannot start here: {reason}; "
            "pass --unsandboxed to judge without it (the record says so)")


@dataclass(frozen=True)
class Context:
    """One evaluation's fixed facts: its config, base seed and the judge's private copy of REF."""

    cfg: EvalConfig
    seed: int
    ref_copy: Path
    ref_sha256: str

    @property
    def timed(self) -> bool:
        return self.cfg.device == "cuda" or self.cfg.time_on_cpu


def read_candidate(path: Path) -> bytes:
    """The candidate's bytes, read once: hashed for its compile cache and handed to its worker, the same bytes."""
    try:
        return path.read_bytes()
    except OSError as err:
        raise KfuseError(f"{path}: cannot read ({err.strerror})") from None


@dataclass
class Launched:
    """A worker started for one candidate whose code it has not been given yet (`WorkerHandle.hand_over`)."""

    worker: WorkerHandle
    name: str  # the candidate's file name
    source: bytes


def spawn_worker(cfg: EvalConfig, source: bytes, warm_cuda: bool) -> WorkerHandle:
    """A worker started for a file (`source`: its compile cache is this file's), returning at once: it starts
    (sandbox, `import torch`, with `warm_cuda` its CUDA context and CUPTI) while the judge does other work."""
    return WorkerHandle(interpret=cfg.device == "cpu", timeout_s=cfg.timeout_s, isolated=cfg.sandboxed,
                        gpu=cfg.device == "cuda", limits=cfg.limits, warm_cuda=warm_cuda,
                        compile_cache=cache.compile_cache(source) if cfg.compile_cache else None)


def prestart(cand_path: Path, cfg: EvalConfig) -> Launched:
    """eval-suite: the next candidate's worker, started and warmed while the current one is judged (pass it to
    `evaluate` as a future). It shares the device gate until ready, so its CUDA warm-up never overlaps a
    timing, and it holds nothing of the candidate but the judge's copy of its bytes."""
    source = read_candidate(cand_path)
    with GATE.shared():
        worker = spawn_worker(cfg, source, warm_cuda=cfg.device == "cuda")
        try:
            worker.wait_ready()
        except BaseException:
            worker.close()
            raise
    return Launched(worker, cand_path.name, source)


def close_launched(prestarted: Future[Launched]) -> None:
    """A prestarted worker is closed when its evaluation ends, whether or not it was used."""
    try:
        prestarted.result().worker.close()
    except BaseException:  # noqa: BLE001 - it failed to start: nothing to close
        pass


def evaluate(ref_path: Path | str, cand_path: Path | str, cfg: EvalConfig,
             prestarted: Future[Launched] | None = None) -> EvalRecord:
    """Judge one candidate. Bad REF or usage raises KfuseError; anything the candidate does is a record.
    `prestarted` (eval-suite): this candidate's worker, already starting; it is closed here in any case."""
    try:
        return _evaluate(Path(ref_path), Path(cand_path), cfg, prestarted)
    finally:
        if prestarted is not None:
            close_launched(prestarted)  # already closed where it was used; here too where it was not


def _evaluate(ref_path: Path, cand_path: Path, cfg: EvalConfig, prestarted: Future[Launched] | None) -> EvalRecord:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise KfuseError("--device cuda: no CUDA device is available (use --device cpu)")
    if cfg.precision not in DTYPES:
        raise KfuseError(f"--precision {cfg.precision}: expected one of {', '.join(DTYPES)}")
    if cfg.sandboxed and (refusal := sandbox_refusal()):
        raise KfuseError(refusal)
    with tempfile.TemporaryDirectory(prefix="kfuse-ref-") as private:
        ref_copy = snapshot_reference(ref_path, Path(private))
        problem = load_problem(ref_copy, cfg.overrides)
        check_paths(ref_path, cand_path)
        seed = cfg.seed if cfg.seed is not None else secrets.randbelow(2**31 - 10**6)
        record = EvalRecord(problem=problem.name, ref=str(ref_path), candidate=str(cand_path),
                            device=cfg.device, precision=cfg.precision, seed=seed,
                            sandbox="bwrap" if cfg.sandboxed else "none (--unsandboxed)")
        started = time.monotonic()
        ref_sha256 = hashlib.sha256(ref_copy.read_bytes()).hexdigest()
        ctx = Context(cfg, seed, ref_copy, ref_sha256)
        ev = cheats.Evidence()
        verdicts: list[Verdict] = []
        try:
            with ExitStack() as workers:  # the candidate's worker ends here, whatever happened
                launched, planned = _launch_and_prepare(cand_path, problem, ctx, record, prestarted, workers)
                _run(launched, planned, ctx, record, ev, verdicts)
        except WorkerFailure as err:
            record.error = clean_text(err, 4000)
    _conclude(record, ev, verdicts)
    record.elapsed_s = round(time.monotonic() - started, 3)
    return record


def _launch_and_prepare(cand_path: Path, problem: Problem, ctx: Context, record: EvalRecord,
                        prestarted: Future[Launched] | None,
                        workers: ExitStack) -> tuple[Launched, list[PlannedShape]]:
    """The candidate's worker starting (or prestarted) while every shape's references are computed from the
    one snapshot of REF; the worker gets the candidate's code only later (`_run`), once they all exist.
    Records `worker_ready_wait`: how long the references left the judge waiting for the worker."""
    cfg = ctx.cfg
    launched = None
    t0 = time.monotonic()
    with GATE.shared():  # references run on the device: never while another candidate is timed
        if prestarted is None:
            source = read_candidate(cand_path)
            worker = workers.enter_context(spawn_worker(cfg, source, warm_cuda=cfg.device == "cuda"))
            launched = Launched(worker, cand_path.name, source)
        planned = prepare(problem, ctx.seed, cfg, record, ctx.ref_sha256)
        if cfg.device == "cuda":
            torch.cuda.empty_cache()  # the float64 runs' memory back to the device, for the workers
        _phase(record, "references", t0)
        t0 = time.monotonic()
        if launched is not None:
            launched.worker.wait_ready()  # inside the gate: its CUDA warm-up is device work too
    if launched is None:  # outside the gate: the prestart may itself be waiting for it
        launched = prestarted.result()
        workers.enter_context(launched.worker)
    _phase(record, "worker_ready_wait", t0)
    if cfg.device == "cuda":
        record.phases_s["worker_warmup"] = round(launched.worker.warmup_s, 3)
    return launched, planned


def answer_cap(ref: Reference) -> int:
    """The most bytes an honest call answer needs (outputs, inputs, buffers), with room to spare."""
    return 4 * (tensor_bytes(ref.eager.outputs) + tensor_bytes(ref.inputs) + tensor_bytes(ref.eager.buffers)) \
        + ANSWER_FLOOR_BYTES


def _run(launched: Launched, planned: Sequence[PlannedShape], ctx: Context, record: EvalRecord,
         ev: cheats.Evidence, verdicts: list[Verdict]) -> None:
    """The candidate's code handed to its ready worker (every reference exists by now), imported, checked at
    every shape and, where timed and correct, timed against the baselines."""
    cfg, worker = ctx.cfg, launched.worker
    t0 = time.monotonic()
    path = worker.hand_over(launched.name, launched.source)
    loaded = worker.request("load", path=path, device=cfg.device, precision=cfg.precision)
    _phase(record, "import", t0)
    _absorb(ev, loaded.get("facts"))
    if not loaded["ok"]:
        record.error = loaded.get("error", "candidate failed to import")
        return
    record.compiled = True
    t0 = time.monotonic()
    for plan in planned:
        with GATE.shared():
            if not _check_shape(worker, plan, cfg, record, ev, verdicts):
                return
    _phase(record, "checks", t0)
    main_ok = all(v.ok for v in verdicts if not v.shape)
    for v in verdicts:
        if v.shape and main_ok and not v.ok:
            ev.specialized.append(f"correct at the given sizes, wrong at {v.shape}")
    if ctx.timed and main_ok and record.error is None:  # a wrong answer's speed means nothing
        worker.request("drop", keep=[planned[0].shape.label])  # the extra shapes' models leave the device
        t0 = time.monotonic()
        with ExitStack() as workers:
            with GATE.shared():  # baseline workers start and compile (torch.compile) while others are timed
                baselines = _open_baselines(planned[0], ctx, workers)
            _phase(record, "baseline_start", t0)
            t0 = time.monotonic()
            with GATE.exclusive():
                _phase(record, "wait_for_device", t0)
                t0 = time.monotonic()
                _time_all(worker, planned[0], ctx, record, ev, baselines)
            _phase(record, "timing", t0)


def _phase(record: "EvalRecord", name: str, since: float) -> None:
    """Seconds spent in one phase of the evaluation (where a suite's time goes: docs/eval.md)."""
    record.phases_s[name] = round(time.monotonic() - since, 3)


def _add_phase(record: "EvalRecord", name: str, since: float) -> None:
    """Seconds added to a phase that recurs (a build per shape, a call per draw)."""
    record.phases_s[name] = round(record.phases_s.get(name, 0.0) + time.monotonic() - since, 3)


def _check_shape(worker: WorkerHandle, plan: PlannedShape, cfg: EvalConfig, record: EvalRecord,
                 ev: cheats.Evidence, verdicts: list[Verdict]) -> bool:
    """Build the candidate at one shape and judge its draws (and, at the given shape, the poisoned pass);
    False when it cannot even be built there."""
    tol, dtype = TOLERANCES[cfg.precision], DTYPES[cfg.precision]
    shape, refs, pristine = plan.shape, plan.refs, plan.pristine
    record.shapes.append(shape.label or "as given")
    state = {k: v.detach().to("cpu", copy=True) for k, v in pristine.state_dict().items()}
    t0 = time.monotonic()
    built = worker.request("build", key=shape.label, seed=shape.model_seed,
                           init_inputs=shape.problem.init_inputs(), state=state)
    _add_phase(record, "build", t0)
    _absorb(ev, built.get("facts"))
    if not built["ok"]:
        record.error = f"ModelNew(*get_init_inputs()) raised {built.get('error')}"
        verdicts.append(_failed_verdict(shape.model_seed, shape.label, record.error))
        return False
    if built.get("state_error"):
        ev.state = built["state_error"]
    digests: list[str | None] = []
    first: list[torch.Tensor] | None = None
    for i, ref in enumerate(refs):
        ref.seed = shape.input_seeds[i]  # verdicts name the draw
        t_call = time.monotonic()
        answer = worker.request("call", cap=answer_cap(ref), key=shape.label, seed=shape.model_seed,
                                inputs=ref.inputs, late=(i == 0 and not shape.label),
                                profile=(i == 1 or len(refs) == 1) and not shape.label)
        # Triton/JIT compilation (and autotuning, per shape) lands in a shape's first call
        _add_phase(record, "draws" if i else "first_call" if not shape.label else "first_call_extra", t_call)
        t0 = time.monotonic()
        outs = _judge_call(answer, ref, shape.label, dtype, tol, ev, verdicts, record)
        _add_phase(record, "compare", t0)
        digests.append(output_digest(outs))
        if i == 0 and not shape.label:
            first = outs  # kept for the poisoned pass; every other draw's output is dropped here
        del outs, answer
    _check_repeats(digests, refs, shape.label, ev)
    if not shape.label:
        t0 = time.monotonic()
        _poison_pass(worker, shape, refs[0], first, ev)
        _add_phase(record, "poison", t0)
        t0 = time.monotonic()
        with _REFERENCE_LOCK:
            ev.ref_aliases_input, ev.ref_modifies_inputs = reference_behaviour(pristine, refs[0].inputs,
                                                                               cfg.device, dtype)
        _add_phase(record, "reference_behaviour", t0)
    return True


def output_digest(outs: Sequence[torch.Tensor] | None) -> str | None:
    """A draw's output as a hash of its bytes: enough to see a repeat, without keeping the output."""
    if outs is None:
        return None
    h = hashlib.sha256()
    for o in outs:
        h.update(f"{o.dtype}{tuple(o.shape)}".encode())
        h.update(o.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if o.numel() else b"")
    return h.hexdigest()


def rename_buffers(buffers: Mapping[str, torch.Tensor],
                   reference: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The candidate's buffers under the reference's names when it names them differently but keeps their
    order and shapes (the worker loaded Model's state into them the same way)."""
    if set(buffers) == set(reference) or len(buffers) != len(reference):
        return dict(buffers)
    if any(a.shape != b.shape for a, b in zip(buffers.values(), reference.values())):
        return dict(buffers)
    return dict(zip(reference, buffers.values()))


def _judge_call(answer: dict[str, Any], ref: Reference, label: str, dtype: torch.dtype, tol: Any,
                ev: cheats.Evidence, verdicts: list[Verdict], record: EvalRecord) -> list[torch.Tensor] | None:
    _absorb(ev, answer.get("facts"))
    if not answer["ok"]:
        text = f"candidate raised {answer.get('error')}"
        record.error = record.error or text
        verdicts.append(_failed_verdict(ref.seed, label, text))
        return None
    ev.calls += 1
    outs = answer["outputs"]
    if outs is None:
        verdicts.append(_failed_verdict(ref.seed, label, "output has no readable data"))
        return None
    verdicts.append(compare(Results(outs, rename_buffers(answer["buffers"], ref.eager.buffers)), ref, tol, label))
    sent = cast_inputs(ref.inputs, "cpu", dtype)
    for j, (before, after) in enumerate(zip(sent, answer["inputs_after"])):
        if not cheats.bitwise_equal(before, after):
            ev.inputs_modified.append(f"input {j} changed by the call")
    return outs


def _failed_verdict(seed: int, label: str, text: str) -> Verdict:
    return Verdict(seed, label, dict.fromkeys(RULES, False), math.inf, 0.0, math.inf, [text])


def _check_repeats(digests: Sequence[str | None], refs: Sequence[Reference], label: str,
                   ev: cheats.Evidence) -> None:
    """A later draw that returns an earlier draw's output bit for bit, where the references differ."""
    for i in range(1, len(digests)):
        for j in range(i):
            if digests[i] is None or digests[i] != digests[j]:
                continue
            ref_same = all(cheats.bitwise_equal(x.cpu(), y.cpu())
                           for x, y in zip(refs[i].eager.outputs, refs[j].eager.outputs))
            if not ref_same:
                where = f" at {label}" if label else ""
                ev.repeated.append(f"draw {i} returned draw {j}'s output{where}")
                break


def _poison_pass(worker: WorkerHandle, shape: Shape, ref: Reference, normal: list[torch.Tensor] | None,
                 ev: cheats.Evidence) -> None:
    """Call again on draw 0 with every torch.empty* poisoned; poison bits in the output = unwritten."""
    if normal is None:
        return
    answer = worker.request("call", cap=answer_cap(ref), key=shape.label, seed=shape.model_seed, inputs=ref.inputs,
                            poison=True, late=True)
    _absorb(ev, answer.get("facts"))
    if not answer["ok"] or answer["outputs"] is None:
        ev.poison_error = answer.get("error") or "no readable output"
        return
    for k, (p, n, r) in enumerate(zip(answer["outputs"], normal, ref.eager.outputs)):
        bad = cheats.unwritten_count(p, n, r)
        if bad:
            ev.unwritten.append(f"output {k}: {bad} of {p.numel()} elements never written")


def reference_behaviour(pristine: torch.nn.Module, inputs: Sequence[torch.Tensor], device: str,
                        dtype: torch.dtype) -> tuple[bool, bool]:
    """(returns a view of an input, writes into an input) for the reference itself: then it is allowed."""
    model = copy.deepcopy(pristine).to(device)
    xs = cast_inputs(inputs, device, dtype)
    before = [x.clone() for x in xs]
    with torch.no_grad():
        outs = flatten(model(*xs))
    return bool(cheats.aliases(outs, xs)), any(not cheats.bitwise_equal(a, b) for a, b in zip(before, xs))


def timed_draw(ctx: Context, shape: Shape, i: int) -> list[torch.Tensor]:
    """Timed call i's fresh inputs (negative i: warm-up), from the judge's own seed; drawn on the GPU where the
    judge runs there (staging copies them from the device straight into the worker's file)."""
    device = ctx.cfg.device if ctx.cfg.device == "cuda" else None
    with _REFERENCE_LOCK:
        return seeded_inputs(shape.problem, derive(ctx.seed, "timed", i), device=device)


def clock_config(ctx: Context, plan: PlannedShape) -> ClockConfig:
    cfg = ctx.cfg
    return ClockConfig(runs=timed_runs(cfg.perf_trials, tensor_bytes(plan.refs[0].inputs)), warmup=cfg.warmup,
                       checks_per_batch=cfg.timed_checks)


@dataclass(frozen=True)
class Baseline:
    """A baseline to time: its cached (or failed) timing, or a live worker with Model built and warmed."""

    key: str
    known: dict[str, Any] | None = None
    worker: WorkerHandle | None = None


def _open_baselines(plan: PlannedShape, ctx: Context, workers: ExitStack) -> dict[str, Baseline]:
    """Eager and torch.compile of Model, each from the cache or in its own sandboxed worker, built and
    called once (torch.compile compiles there), ready to be timed."""
    cfg, shape = ctx.cfg, plan.shape
    clock_cfg = clock_config(ctx, plan)
    state = {n: v.detach().to("cpu", copy=True) for n, v in plan.pristine.state_dict().items()}
    out: dict[str, Baseline] = {}
    for name, compiled in (("eager", False), ("compile", True)):
        k = cache.key(kind="baseline", ref=ctx.ref_sha256, overrides=dict(cfg.overrides), shape=shape.label,
                      compiled=compiled, device=cfg.device, precision=cfg.precision, runs=clock_cfg.runs,
                      warmup=clock_cfg.warmup, sandboxed=cfg.sandboxed)
        if compiled and not cfg.compile_baseline:
            out[name] = Baseline(k, timing_unavailable("torch.compile baseline not requested").to_json())
            continue
        hit = cache.load(k)
        if hit is not None:
            out[name] = Baseline(k, {**hit, "cached": True})
            continue
        try:
            source = ctx.ref_copy.read_bytes()  # the judge's private snapshot of REF
            worker = workers.enter_context(spawn_worker(cfg, source, warm_cuda=False))  # never profiled
            path = worker.hand_over(ctx.ref_copy.name, source)
            loaded = worker.request("load", path=path, device=cfg.device, precision=cfg.precision, class_name="Model")
            built = worker.request("build", key=shape.label, seed=shape.model_seed, compile=compiled,
                                   init_inputs=shape.problem.init_inputs(), state=state) if loaded["ok"] else loaded
            if not built["ok"]:
                out[name] = Baseline(k, timing_unavailable(f"baseline failed: {built.get('error')}").to_json())
                continue
            worker.stage(shape.label, [-1000], lambda i: timed_draw(ctx, shape, i))
            worker.quick(INLINE_NEXT)
            worker.quick(INLINE_GO)  # the first call: torch.compile compiles here, off the device lock
            worker.request("kept", indices=[])
            out[name] = Baseline(k, worker=worker)
        except WorkerFailure as err:
            out[name] = Baseline(k, timing_unavailable(f"baseline failed: {clean_text(err, 300)}").to_json())
    return out


def _time_all(worker: WorkerHandle, plan: PlannedShape, ctx: Context, record: EvalRecord,
              ev: cheats.Evidence, baselines: Mapping[str, Baseline]) -> None:
    """The candidate and the baselines (eager and torch.compile of Model, each in its own sandboxed worker)
    timed by the judge's clock on the same fresh draws; the candidate's timed outputs checked. The
    candidate's own CUDA-event time is reported beside it (`timing.candidate_events`), deciding nothing."""
    cfg, shape = ctx.cfg, plan.shape
    clock_cfg = clock_config(ctx, plan)

    def draw(i: int) -> list[torch.Tensor]:
        return timed_draw(ctx, shape, i)

    def check(i: int, outs: list[torch.Tensor]) -> list[str]:
        with _REFERENCE_LOCK:
            ref, _ = reference_run(shape.problem, shape.model_seed, cfg.device, cfg.precision,
                                   input_seed=derive(ctx.seed, "timed", i))
        return compare(Results(outs, ref.eager.buffers), ref, TOLERANCES[cfg.precision]).failures

    out_bytes = tensor_bytes(plan.refs[0].eager.outputs)
    t0 = time.monotonic()
    result = time_outside(worker, shape.label, draw, check, clock_cfg, out_bytes, derive(ctx.seed, "checks"))
    _phase(record, "timing_candidate", t0)
    ev.timed_wrong.extend(result.failures[:5])
    record.timing = {"candidate": result.timing.to_json(),
                     "protocol": {"overhead_ms": result.overhead_ms, "stage_median_ms": _median(result.stage_ms),
                                  "checked_calls": result.checked}}
    record.runtime_ms = result.timing.median_ms if not result.failures else None
    if cfg.device == "cuda":
        t0 = time.monotonic()
        _event_timing(worker, plan, cfg, record, ev)
        _phase(record, "timing_events", t0)
        events = record.timing.get("candidate_events") or {}
        clock_ms, event_ms = result.timing.median_ms, events.get("median_ms")
        if event_ms is not None and not result.failures and clock_ms - event_ms > max(EVENT_SLACK_MS, 3 * event_ms):
            ev.timing.append(f"in-worker event time {event_ms:.3g} ms, judge's clock {clock_ms:.3g} ms per call")
    for name, baseline in baselines.items():
        base = _time_baseline(baseline, shape, draw, clock_cfg, out_bytes)
        record.timing[name] = base
        if name == "eager" and base.get("stage_median_ms") is not None and result.stage_ms:
            # more than double the reference's staging, and more than the timed call itself: hidden work
            extra = _median(result.stage_ms) - base["stage_median_ms"]
            if extra > max(STAGE_SLACK_MS, result.timing.median_ms, base["stage_median_ms"]):
                ev.timing.append(f"staging took {extra:.3g} ms longer than the reference's, more than the timed "
                                 f"call itself ({result.timing.median_ms:.3g} ms): work done before the clock started")
    record.ref_runtime_ms = record.timing["eager"].get("median_ms")
    record.compile_runtime_ms = record.timing["compile"].get("median_ms")
    if record.runtime_ms:
        if record.ref_runtime_ms:
            record.speedup_eager = record.ref_runtime_ms / record.runtime_ms
        if record.compile_runtime_ms:
            record.speedup_compile = record.compile_runtime_ms / record.runtime_ms


MIN_TIMED_RUNS = 30  # DESIGN.md: at least 30 timed runs
STAGED_BYTES = 4 << 30  # fresh inputs shipped per timed model: beyond this, fewer runs (never under 30)


def timed_runs(perf_trials: int, in_bytes: int) -> int:
    """`--perf-trials` timed calls, fewer where so many fresh inputs would take longer to ship than to time
    (a 128 MB input: 32 calls), never fewer than 30."""
    return max(MIN_TIMED_RUNS, min(perf_trials, STAGED_BYTES // max(in_bytes, 1)))
EVENT_SLACK_MS = 0.1  # launch and sync overhead the events never see (tiny kernels are launch-bound)
STAGE_SLACK_MS = 2.0  # staging noise (file, copy, L2 flush, a busy machine) not counted as hidden work


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _event_timing(worker: WorkerHandle, plan: PlannedShape, cfg: EvalConfig, record: EvalRecord,
                  ev: cheats.Evidence) -> None:
    """The candidate timed in its worker with CUDA events (kfuse.timing.time_cuda), reported beside the
    judge's clock; a report the judge's wall clock contradicts is flagged."""
    start = time.perf_counter()
    answer = worker.request("time", key=plan.shape.label, inputs=list(plan.refs[0].inputs), warmup=cfg.warmup,
                            runs=cfg.perf_trials)
    judge_wall_ms = (time.perf_counter() - start) * 1e3
    _absorb(ev, answer.get("facts"))
    ev.replaced.extend(answer.get("facts", {}).get("timing_replaced") or [])
    if not answer["ok"] or "timing" not in answer:
        record.notes.append(f"in-worker event timing failed: {answer.get('error')}")
        return
    t = answer["timing"]
    record.timing["candidate_events"] = t
    if t.get("available") and t["median_ms"] is not None and t["median_ms"] * t["n"] / 2 > judge_wall_ms:
        # n runs each at least the median for half of them: their sum cannot exceed the judge's wall clock
        ev.timing.append(f"reported median {t['median_ms']:.3g} ms x {t['n']} runs > judge wall {judge_wall_ms:.3g} ms")


def _time_baseline(baseline: Baseline, shape: Shape, draw: Callable[[int], list[torch.Tensor]],
                   clock_cfg: ClockConfig, out_bytes: int) -> dict[str, Any]:
    """A baseline's timing: known already, or timed now like the candidate (its outputs unchecked: it is
    the reference) and stored in the cache."""
    if baseline.known is not None or baseline.worker is None:
        return baseline.known or timing_unavailable("baseline not measured").to_json()
    try:
        result = time_outside(baseline.worker, shape.label, draw, lambda i, outs: [], clock_cfg, out_bytes, 0)
    except WorkerFailure as err:
        return timing_unavailable(f"baseline failed: {clean_text(err, 300)}").to_json()
    value = {**result.timing.to_json(), "stage_median_ms": _median(result.stage_ms),
             "overhead_ms": result.overhead_ms}
    cache.store(baseline.key, value)
    return value


def _absorb(ev: cheats.Evidence, facts: Mapping[str, Any] | None) -> None:
    if not facts:
        return
    for key in ("replaced", "precision", "modes", "output_types", "aliases", "late_changes", "threads",
                "introspection"):
        getattr(ev, key).extend(facts.get(key) or [])
    ev.custom_launches += int(facts.get("launches") or 0)
    ev.custom_names = sorted(set(ev.custom_names) | set(facts.get("launch_names") or []))
    if facts.get("gpu_kernels") is not None:
        custom, library = cheats.split_kernels(facts["gpu_kernels"])
        ev.gpu_custom = (ev.gpu_custom or []) + custom
        ev.gpu_library += library


def _conclude(record: EvalRecord, ev: cheats.Evidence, verdicts: Sequence[Verdict]) -> None:
    found = cheats.detect(ev)
    record.flags = list(found)
    record.flag_details = found
    record.triton_launches = ev.custom_launches
    record.kernels = sorted(set(ev.gpu_custom)) if ev.gpu_custom is not None else ev.custom_names
    record.library_kernels = sorted(set(ev.gpu_library))
    record.kernel_count_source = "profiler" if ev.gpu_custom is not None else "triton_launches"
    if not record.timing:
        record.timing = {"candidate": timing_unavailable(
            "no CUDA device: timing needs a GPU" if record.device == "cpu" else "not measured").to_json()}
    if not verdicts:
        record.correct = False
        return
    record.trials = len(verdicts)
    record.rules = {r: all(v.rules[r] for v in verdicts) for r in RULES}
    extra = [v for v in verdicts if v.shape]
    record.rules["extra_shape"] = all(v.ok for v in extra) if extra else None
    record.max_abs_err = max(v.max_abs_err for v in verdicts)
    record.ref_max_abs_err = max(v.ref_max_abs_err for v in verdicts)
    record.max_abs_diff_eager = max(v.max_abs_diff_eager for v in verdicts)
    record.allclose_reference = combine_references(v.allclose_reference for v in verdicts)
    record.kernelbench_allclose = kernelbench_allclose(verdicts)
    record.failures = [f"seed {v.seed}{' at ' + v.shape if v.shape else ''}: {f}" for v in verdicts for f in v.failures]
    contract_ok = all(v.ok for v in verdicts) and record.error is None
    record.correct = contract_ok and not (set(found) & cheats.FAILING)
