"""One (REF, CANDIDATE) pair -> an `EvalRecord` (-> JSON).

The judge reads REF once (into a folder only it can see) and computes every reference result of every
shape (verify.reference_run: eager in the chosen precision and float64) before the candidate starts. Its
worker process starts meanwhile (sandbox, torch, on the GPU CUDA and CUPTI), so those seconds overlap the
references, but it is handed the candidate's code only once they all exist. The candidate lives in a
sandboxed worker process (sandbox.py, ipc.py, worker.py) that receives inputs and a model seed, and sends back
outputs; it never sees a reference, an input seed or the base seed. Per shape the candidate is built once and
called on fresh input draws, so a result cached across calls fails; its state is reset before each call so
buffers (BatchNorm statistics) match a fresh reference.

The stages: shapes.py plans the shapes (the problem as given and changed sizes) and computes their references,
launch.py starts the worker, speed.py times a correct candidate against its baselines; this module runs them in
order, checks the candidate's answers at every shape and assembles the record.
"""

from __future__ import annotations

import copy
import hashlib
import math
import secrets
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kfuse.errors import KfuseError
from kfuse.judge import cheats, sandbox
from kfuse.judge.clock import GATE
from kfuse.judge.ipc import ANSWER_FLOOR_BYTES, WorkerFailure, WorkerHandle, clean_text, tensor_bytes
from kfuse.judge.launch import Launched, close_launched, read_candidate, spawn_worker
from kfuse.judge.shapes import REFERENCE_LOCK, PlannedShape, Shape, prepare, snapshot_reference
from kfuse.judge.speed import open_baselines, stage_area, time_all
from kfuse.judge.stage_area import Area
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
)


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

    def phase(self, name: str, since: float) -> None:
        """Seconds spent in one phase of the evaluation (where a suite's time goes: docs/eval.md)."""
        self.phases_s[name] = round(time.monotonic() - since, 3)

    def add_phase(self, name: str, since: float) -> None:
        """Seconds added to a phase that recurs (a build per shape, a call per draw)."""
        self.phases_s[name] = round(self.phases_s.get(name, 0.0) + time.monotonic() - since, 3)


def _jsonable(obj: Any) -> Any:
    """Strict JSON: NaN -> null, inf -> "inf"."""
    if isinstance(obj, float):
        return None if math.isnan(obj) else ("inf" if obj == math.inf else "-inf" if obj == -math.inf else obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


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
                area = stage_area(ctx, planned[0])  # allocated while the candidate's correctness is checked
                if area is not None:
                    workers.enter_context(area)
                _run(launched, planned, ctx, record, ev, verdicts, area)
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
        record.phase("references", t0)
        t0 = time.monotonic()
        if launched is not None:
            launched.worker.wait_ready()  # inside the gate: its CUDA warm-up is device work too
    if launched is None:  # outside the gate: the prestart may itself be waiting for it
        launched = prestarted.result()
        workers.enter_context(launched.worker)
    record.phase("worker_ready_wait", t0)
    if cfg.device == "cuda":
        record.phases_s["worker_warmup"] = round(launched.worker.warmup_s, 3)
    return launched, planned


def answer_cap(ref: Reference) -> int:
    """The most bytes an honest call answer needs (outputs, inputs, buffers), with room to spare."""
    return 4 * (tensor_bytes(ref.eager.outputs) + tensor_bytes(ref.inputs) + tensor_bytes(ref.eager.buffers)) \
        + ANSWER_FLOOR_BYTES


def _run(launched: Launched, planned: Sequence[PlannedShape], ctx: Context, record: EvalRecord,
         ev: cheats.Evidence, verdicts: list[Verdict], area: Area | None = None) -> None:
    """The candidate's code handed to its ready worker (every reference exists by now), imported, checked at
    every shape and, where timed and correct, timed against the baselines."""
    cfg, worker = ctx.cfg, launched.worker
    t0 = time.monotonic()
    path = worker.hand_over(launched.name, launched.source)
    loaded = worker.request("load", path=path, device=cfg.device, precision=cfg.precision)
    record.phase("import", t0)
    ev.absorb(loaded.get("facts"))
    if not loaded["ok"]:
        record.error = loaded.get("error", "candidate failed to import")
        return
    record.compiled = True
    t0 = time.monotonic()
    for plan in planned:
        with GATE.shared():
            if not _check_shape(worker, plan, cfg, record, ev, verdicts):
                return
    record.phase("checks", t0)
    main_ok = all(v.ok for v in verdicts if not v.shape)
    for v in verdicts:
        if v.shape and main_ok and not v.ok:
            ev.specialized.append(f"correct at the given sizes, wrong at {v.shape}")
    if ctx.timed and main_ok and record.error is None:  # a wrong answer's speed means nothing
        worker.request("drop", keep=[planned[0].shape.label])  # the extra shapes' models leave the device
        t0 = time.monotonic()
        with ExitStack() as workers:
            with GATE.shared():  # baseline workers start and compile (torch.compile) while others are timed
                baselines = open_baselines(planned[0], ctx, workers)
            record.phase("baseline_start", t0)
            t0 = time.monotonic()
            if area is not None:
                area.ready()  # its thread holds the gate as a sharer: joined inside exclusive(), it would deadlock
            with GATE.exclusive():
                record.phase("wait_for_device", t0)
                t0 = time.monotonic()
                time_all(worker, planned[0], ctx, record, ev, baselines, area)
            record.phase("timing", t0)


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
    record.add_phase("build", t0)
    ev.absorb(built.get("facts"))
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
        record.add_phase("draws" if i else "first_call" if not shape.label else "first_call_extra", t_call)
        t0 = time.monotonic()
        outs = _judge_call(answer, ref, shape.label, dtype, tol, ev, verdicts, record)
        record.add_phase("compare", t0)
        digests.append(output_digest(outs))
        if i == 0 and not shape.label:
            first = outs  # kept for the poisoned pass; every other draw's output is dropped here
        del outs, answer
    _check_repeats(digests, refs, shape.label, ev)
    if not shape.label:
        t0 = time.monotonic()
        _poison_pass(worker, shape, refs[0], first, ev)
        record.add_phase("poison", t0)
        t0 = time.monotonic()
        with REFERENCE_LOCK:
            ev.ref_aliases_input, ev.ref_modifies_inputs = reference_behaviour(pristine, refs[0].inputs,
                                                                               cfg.device, dtype)
        record.add_phase("reference_behaviour", t0)
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
    ev.absorb(answer.get("facts"))
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
    ev.absorb(answer.get("facts"))
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
