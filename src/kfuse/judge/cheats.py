"""Cheat detection: the probes the worker runs around a candidate, and the table of named detectors.

Two halves:
- probes (`Baseline`, `precision_flags`, `output_problems`, `aliases`, `PoisonEmpty`, launch and
  introspection counters) run inside the worker process. The worker imports this module *before* the
  candidate, so the references captured here are the real torch/time functions.
- `DETECTORS` runs in the judge process over `Evidence` (what the worker reported plus what the judge
  compared itself) and names each finding. A detector with `fails=True` makes `correct` false.

Limit, stated once: the worker shares its process with the candidate, so a candidate written against
this judge could forge the worker's *reports* (not the judge's comparisons). What it cannot forge is the
correctness verdict: the references are computed in the judge process from seeds drawn after the
candidate was imported, and never sent to the worker.
"""

from __future__ import annotations

import functools
import gc
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# --- identity checks: functions a candidate could replace to fool a checker or a timer ----------------

WATCHED = (
    # comparison helpers KernelBench-style checkers call
    "torch.allclose", "torch.isclose", "torch.equal", "torch.isfinite", "torch.isnan", "torch.abs",
    "torch.testing.assert_close", "torch.Tensor.__eq__", "torch.Tensor.__ne__", "torch.Tensor.__sub__",
    "torch.Tensor.allclose", "torch.Tensor.equal", "torch.Tensor.abs", "torch.Tensor.max",
    # what the worker itself uses to read, copy and ship results
    "torch.Tensor.clone", "torch.Tensor.cpu", "torch.Tensor.to", "torch.Tensor.copy_", "torch.Tensor.detach",
    "torch.Tensor.data_ptr", "torch.Tensor.untyped_storage", "torch.save", "torch.load", "torch.manual_seed",
    "torch.nn.Module.__call__", "torch.nn.Module._call_impl", "torch.nn.Module.load_state_dict",
    "torch.nn.Module.named_buffers",
    # timing
    "torch.cuda.Event", "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time", "torch.cuda.Event.synchronize",
    "torch.cuda.synchronize", "torch.cuda.current_stream", "torch.cuda.Stream", "torch.cuda.is_available",
    "time.time", "time.time_ns", "time.perf_counter", "time.perf_counter_ns", "time.monotonic",
    "time.monotonic_ns", "time.process_time", "time.sleep",
    # what counts the kernels that ran on the GPU
    "torch.profiler.profile", "torch.profiler.profile.events", "torch.profiler.profile.__exit__",
    # the judge's own type checks
    "builtins.isinstance", "builtins.type", "builtins.getattr", "builtins.id", "math.isnan", "math.isfinite",
)
_MISSING = object()


def resolve(dotted: str) -> Any:
    """`"torch.Tensor.__eq__"` -> the object (walking attributes from the top module, so a replaced
    submodule attribute is seen too), or _MISSING."""
    parts = dotted.split(".")
    obj: Any = sys.modules.get(parts[0], _MISSING)
    for i, part in enumerate(parts[1:], start=2):
        if obj is _MISSING:
            return _MISSING
        nxt = getattr(obj, part, _MISSING)
        obj = nxt if nxt is not _MISSING else sys.modules.get(".".join(parts[:i]), _MISSING)
    return obj


def _set(dotted: str, value: Any) -> None:
    owner, _, attr = dotted.rpartition(".")
    setattr(resolve(owner), attr, value)


_DYNAMO_WRAPPER_FILE = str(Path(torch.__file__).with_name("_compile.py"))


def _same_function(live: Any, original: Any) -> bool:
    """Identity, or torch._dynamo's own rebinding: importing dynamo (torch.compile does) replaces a few torch
    functions by `torch._disable_dynamo(original)`, same behaviour, new object. Only that exact wrapper
    (code from torch/_compile.py, wrapping the original itself) is accepted."""
    if live is original:
        return True
    code = getattr(live, "__code__", None)
    return getattr(live, "__wrapped__", None) is original and getattr(code, "co_filename", "") == _DYNAMO_WRAPPER_FILE


@dataclass(frozen=True)
class Baseline:
    """The watched objects as they were before the candidate was imported."""

    objects: dict[str, Any]

    @staticmethod
    def capture(extra: Sequence[str] = ()) -> "Baseline":
        return Baseline({name: resolve(name) for name in (*WATCHED, *extra)})

    def replaced(self) -> list[str]:
        return [name for name, obj in self.objects.items() if not _same_function(resolve(name), obj)]

    def restore(self, names: Sequence[str]) -> None:
        """Put the real objects back, so the worker's own reads after a detection stay honest."""
        for name in names:
            try:
                _set(name, self.objects[name])
            except (AttributeError, TypeError):
                pass


# --- global numeric state: flags that change what fp32 means -------------------------------------------

PRECISION_FLAGS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "torch.backends.cuda.matmul.allow_tf32": (
        lambda: torch.backends.cuda.matmul.allow_tf32,
        lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v)),
    "torch.backends.cudnn.allow_tf32": (
        lambda: torch.backends.cudnn.allow_tf32, lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)),
    "torch.get_float32_matmul_precision()": (
        torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (
        lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        lambda v: setattr(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", v)),
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (
        lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        lambda v: setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", v)),
    "torch.backends.cudnn.enabled": (
        lambda: torch.backends.cudnn.enabled, lambda v: setattr(torch.backends.cudnn, "enabled", v)),
    "torch.get_default_dtype()": (torch.get_default_dtype, torch.set_default_dtype),
}


def precision_flags() -> dict[str, Any]:
    out = {}
    for name, (get, _) in PRECISION_FLAGS.items():
        try:
            out[name] = get()
        except Exception:  # noqa: BLE001 - a flag this torch build lacks is simply not watched
            continue
    return out


def restore_precision(before: dict[str, Any], names: Sequence[str]) -> None:
    for name in names:
        try:
            PRECISION_FLAGS[name][1](before[name])
        except Exception:  # noqa: BLE001
            pass


def changed_flags(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [f"{k}: {before[k]!r} -> {after.get(k)!r}" for k in before if after.get(k) != before[k]]


def active_modes() -> list[str]:
    """TorchFunctionMode / TorchDispatchMode objects left on the global stacks (they see every op)."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    stacks = list(_get_current_function_mode_stack()) + list(_get_current_dispatch_mode_stack())
    return [type(m).__name__ for m in stacks]


# --- outputs: what a real result looks like --------------------------------------------------------------


def output_problems(outputs: Sequence[Any]) -> list[str]:
    """Why an output is not a plain, materialized tensor (subclass, meta, fake, functional, no storage)."""
    problems = []
    for i, out in enumerate(outputs):
        if type(out) is not torch.Tensor:  # exact type: a subclass can compute lazily or lie on comparison
            problems.append(f"output {i} is a {type(out).__module__}.{type(out).__qualname__}, not torch.Tensor")
            continue
        if out.is_meta or out.device.type == "meta":
            problems.append(f"output {i} is a meta tensor (no data)")
        elif out.layout != torch.strided:
            problems.append(f"output {i} has layout {out.layout}")
        elif torch._is_functional_tensor(out) or torch._C._functorch.is_functorch_wrapped_tensor(out):
            problems.append(f"output {i} is a functional/functorch wrapper")
        else:
            try:
                out.untyped_storage().data_ptr()
            except Exception as err:  # noqa: BLE001 - fake tensors raise here
                problems.append(f"output {i} has no storage ({type(err).__name__})")
    return problems


def _span(t: torch.Tensor) -> tuple[str, int, int] | None:
    try:
        storage = t.untyped_storage()
        start = storage.data_ptr()
        return str(t.device), start, start + storage.nbytes()
    except Exception:  # noqa: BLE001
        return None


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share any bytes of storage (views of one another included)."""
    sa, sb = _span(a), _span(b)
    if sa is None or sb is None or sa[0] != sb[0] or sa[1] == sa[2] or sb[1] == sb[2]:
        return False
    return sa[1] < sb[2] and sb[1] < sa[2]


def aliases(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> list[str]:
    return [f"output {i} shares memory with input {j}"
            for i, o in enumerate(outputs) for j, x in enumerate(inputs)
            if isinstance(o, torch.Tensor) and isinstance(x, torch.Tensor) and overlaps(o, x)]


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN equal to the same NaN): 'did anything change', not 'is it close'."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# --- poison: make memory the candidate never wrote visible ------------------------------------------------

_EMPTY_OPS = {torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided,
              torch.ops.aten.new_empty, torch.ops.aten.new_empty_strided}


# A quiet NaN with a payload arithmetic never produces (computed NaNs are canonical): an element with these
# exact bits was copied from memory the judge poisoned, so nobody wrote it.
POISON_BITS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float32: (torch.int32, 0x7FDEAD01),
    torch.float64: (torch.int64, 0x7FFDEAD0DEAD0001),
    torch.float16: (torch.int16, 0x7E5B),
    torch.bfloat16: (torch.int16, 0x7FDE),
}


def poison_fill(t: torch.Tensor) -> None:
    if t.dtype in POISON_BITS:
        as_int, bits = POISON_BITS[t.dtype]
        t.view(as_int).fill_(bits)
    elif t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).max)


def unwritten_count(poisoned: torch.Tensor, normal: torch.Tensor, reference: torch.Tensor) -> int:
    """Elements the candidate left unwritten: the poison's exact bits, or non-finite under poison where
    both its normal run and the reference are finite."""
    if poisoned.shape != normal.shape or poisoned.shape != reference.shape or not poisoned.is_floating_point():
        return 0
    ref_ok = torch.isfinite(reference.cpu())
    bad = ~torch.isfinite(poisoned) & torch.isfinite(normal)
    if poisoned.dtype in POISON_BITS:
        as_int, bits = POISON_BITS[poisoned.dtype]
        bad |= poisoned.contiguous().view(as_int) == bits
    return int((bad & ref_ok).sum())


class PoisonEmpty(TorchDispatchMode):
    """Every torch.empty* made inside this mode comes back full of NaN (ints: their max), so an output
    element the kernel never wrote shows up as NaN instead of whatever the allocator had lying around."""

    # TorchDispatchMode's own __enter__/__exit__ are wrapped in torch._disable_dynamo, whose first call imports
    # torch._dynamo (3 s, and it rebinds a few torch functions); the unwrapped originals do the same work.
    def __enter__(self):  # noqa: ANN204
        enter = TorchDispatchMode.__enter__
        return getattr(enter, "__wrapped__", enter)(self)

    def __exit__(self, *exc: object):  # noqa: ANN204
        leave = TorchDispatchMode.__exit__
        return getattr(leave, "__wrapped__", leave)(self, *exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in _EMPTY_OPS and type(out) is torch.Tensor and not out.is_meta:
            poison_fill(out)
        return out


# TorchDispatchMode.__init_subclass__ wraps a subclass's __torch_dispatch__ the same way: unwrapped here.
PoisonEmpty.__torch_dispatch__ = getattr(PoisonEmpty.__torch_dispatch__, "__wrapped__", PoisonEmpty.__torch_dispatch__)


def poison_allocator(device: str, nbytes: int) -> None:
    """Fill and free blocks of about the output's size, so that a fresh allocation (CUDA caching allocator,
    or malloc's free lists on the CPU) most likely starts as NaN rather than an earlier result."""
    nbytes = max(4096, min(int(nbytes), 256 * 1024 * 1024))
    blocks = [torch.empty(n // 4, dtype=torch.float32, device=device) for n in (nbytes, 2 * nbytes, nbytes // 2 + 4)]
    for block in blocks:
        poison_fill(block)
    del blocks


# --- counters the worker installs before the candidate is imported ----------------------------------------


@dataclass
class Counter:
    count: int = 0
    names: set[str] = field(default_factory=set)
    armed: bool = True  # introspection counts only while the candidate's forward runs


LAUNCHES = Counter()
INTROSPECTION = Counter(armed=False)


def _counting_run(run: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(run)
    def run_counted(self, *args, grid, warmup, **kwargs):  # noqa: ANN001, ANN202
        if not warmup:
            LAUNCHES.count += 1
            LAUNCHES.names.add(getattr(getattr(self, "fn", None), "__name__", type(self).__name__))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    run_counted.__kfuse_counter__ = True
    return run_counted


def install_launch_counter() -> list[str]:
    """Count Triton kernel launches, compiled (JITFunction) or interpreted (TRITON_INTERPRET=1): both go
    through `<cls>.run(..., grid=, warmup=False)`, the path `kernel[grid](...)` and the autotuner take.
    Returns the dotted names of the wrapped methods (the worker watches them for replacement)."""
    wrapped = []
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # noqa: BLE001 - no triton: no Triton launches to count
        return wrapped
    classes: list[tuple[str, type]] = [("triton.runtime.jit.JITFunction", JITFunction)]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(("triton.runtime.interpreter.InterpretedFunction", InterpretedFunction))
    except Exception:  # noqa: BLE001
        pass
    for name, cls in classes:
        if not getattr(cls.run, "__kfuse_counter__", False):
            cls.run = _counting_run(cls.run)
        wrapped.append(name)
    return wrapped


def install_introspection_counter() -> None:
    """Count heap scans (gc.get_objects and friends) made while the candidate's forward runs: the way to
    find another tensor in the process (KernelBench's reference output) instead of computing one."""
    for name in ("get_objects", "get_referrers", "get_referents"):
        real = getattr(gc, name)
        if getattr(real, "__kfuse_counter__", False):
            continue

        def counted(*args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any) -> Any:
            if INTROSPECTION.armed:
                INTROSPECTION.count += 1
                INTROSPECTION.names.add(f"gc.{_name}")
            return _real(*args, **kwargs)

        counted.__kfuse_counter__ = True
        setattr(gc, name, counted)


# --- kernels that ran on the GPU (profiler records: CUPTI through kineto) ---------------------------------

# Kernels that are not the candidate's own: torch's native kernels, vendor libraries (cuBLAS/cuBLASLt incl.
# nvjet, CUTLASS inside them, cuDNN), copies and fills, and kernels torch.compile (Inductor) generates.
LIBRARY_KERNEL = re.compile(
    r"(^void at::|at::native|^at_|^void (cutlass|cublas|cudnn|gemv|gemmk|gemmSN|splitKreduce|dot_kernel|"
    r"reduce_1Block|scal_kernel|axpy)|cublas|cudnn|cutlass|nvjet|xmma|^sm\d+_|^(ampere|volta|turing|hopper|"
    r"maxwell)_|^Memcpy|^Memset|^memcpy|^memset|^triton_(poi|red|per|tem|mm|bmm)_|^void (cask|fft|cub)|"
    r"^void c10|^elementwise_kernel|^vectorized_elementwise_kernel|^reduce_kernel)")


def gpu_kernel_names(profiler: Any) -> list[str]:
    """Names of the CUDA kernels the profiler recorded (one entry per launch)."""
    names = []
    for event in profiler.events():
        if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            names.append(str(event.name))
    return names[:4096]


# A kernel instantiated from CUTLASS's templates (`cutlass::device_kernel<...>`, CUTLASS 3's entry point) is the
# candidate's own where its template names a type of its own (a mainloop, an epilogue, a functor: kfuse's
# `--backend cuda` GEMM names kf_sm90::SplitMainloop and its region's epilogue), and a library's where every name
# in it is CUTLASS's, CuTe's, torch's or the language's (torch's own CUTLASS GEMMs, or a stock CUTLASS GEMM).
CUTLASS_ENTRY = re.compile(r"^void cutlass::device_kernel<")
LIBRARY_NAMESPACES = ("cutlass::", "cute::", "std::", "at::", "c10::", "torch::", "cub::", "thrust::")
PLAIN_NAMES = frozenset("void bool char short int long float double signed unsigned const volatile true false "
                        "half __half __nv_bfloat16 nv_bfloat16 Params".split())


def own_type_in(name: str) -> bool:
    """Whether a kernel name's template names a type outside the library namespaces and the language's."""
    for ident in re.findall(r"(?<!\w)[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*", name):  # not a literal's suffix (1ul)
        if not ident.startswith(LIBRARY_NAMESPACES) and ident not in PLAIN_NAMES:
            return True
    return False


def is_library_kernel(name: str) -> bool:
    if CUTLASS_ENTRY.search(name) and own_type_in(name):
        return False
    return bool(LIBRARY_KERNEL.search(name))


def split_kernels(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the candidate's own kernels, library kernels): what LIBRARY_KERNEL does not match is custom --
    Triton, load_inline CUDA, CuPy, raw PTX alike -- and so is a CUTLASS template the candidate instantiated with a
    type of its own (own_type_in)."""
    library = {n for n in set(names) if is_library_kernel(n)}  # each distinct name classified once
    return [n for n in names if n not in library], [n for n in names if n in library]


# --- the detector table (judge side) ------------------------------------------------------------------


@dataclass
class Evidence:
    """Everything the detectors look at for one candidate; each list holds one line per observation."""

    replaced: list[str] = field(default_factory=list)  # watched functions replaced (import or any call)
    precision: list[str] = field(default_factory=list)  # global precision flags changed
    modes: list[str] = field(default_factory=list)  # torch function/dispatch modes left active
    output_types: list[str] = field(default_factory=list)  # not a plain materialized tensor
    aliases: list[str] = field(default_factory=list)  # output storage overlaps an input's
    inputs_modified: list[str] = field(default_factory=list)  # the judge's copy differs after the call
    repeated: list[str] = field(default_factory=list)  # a trial returned an earlier trial's output
    unwritten: list[str] = field(default_factory=list)  # NaN under poison where the normal run had values
    late_changes: list[str] = field(default_factory=list)  # output changed after forward returned
    threads: list[str] = field(default_factory=list)  # threads started by forward, still running
    introspection: list[str] = field(default_factory=list)  # heap scans during forward
    specialized: list[str] = field(default_factory=list)  # correct at the file's sizes, wrong at others
    timing: list[str] = field(default_factory=list)  # timing reports the judge's clock contradicts
    timed_wrong: list[str] = field(default_factory=list)  # timed calls whose outputs failed the contract
    state: str = ""  # why Model's state_dict did not load into ModelNew
    poison_error: str = ""  # why the poisoned pass could not run
    custom_launches: int = 0  # Triton launches counted in the worker (the CPU's only count)
    custom_names: list[str] = field(default_factory=list)
    gpu_custom: list[str] | None = None  # the candidate's own kernels in the profiler's records (GPU)
    gpu_library: list[str] = field(default_factory=list)  # library kernels in those records
    calls: int = 0  # forward calls the launch count covers
    ref_aliases_input: bool = False  # the reference itself returns a view of an input
    ref_modifies_inputs: bool = False  # the reference itself writes into an input

    def absorb(self, facts: Mapping[str, Any] | None) -> None:
        """The facts a worker answer carries (what its probes saw) added to this evidence."""
        if not facts:
            return
        for key in ("replaced", "precision", "modes", "output_types", "aliases", "late_changes", "threads",
                    "introspection"):
            getattr(self, key).extend(facts.get(key) or [])
        self.custom_launches += int(facts.get("launches") or 0)
        self.custom_names = sorted(set(self.custom_names) | set(facts.get("launch_names") or []))
        if facts.get("gpu_kernels") is not None:
            custom, library = split_kernels(facts["gpu_kernels"])
            self.gpu_custom = (self.gpu_custom or []) + custom
            self.gpu_library += library


def _no_custom(e: Evidence) -> str | None:
    if e.gpu_custom is not None:  # the GPU: what the profiler saw run decides
        if e.gpu_custom:
            return None
        library = ", ".join(sorted(set(e.gpu_library))[:3]) or "none"
        return f"0 kernels of its own on the GPU in a profiled forward (library kernels: {library})"
    return f"0 Triton launches in {e.calls} forward calls" if e.calls and not e.custom_launches else None


def _lines(items: Sequence[str]) -> str | None:
    return "; ".join(dict.fromkeys(items)) if items else None


@dataclass(frozen=True)
class Detector:
    name: str
    fails: bool  # True: the finding makes `correct` false
    what: str  # the cheat, in one line (docs/eval.md repeats the table)
    check: Callable[[Evidence], str | None]  # the finding's detail, or None when clean


DETECTORS: tuple[Detector, ...] = (
    Detector("monkeypatch", True, "replaced torch/time/builtin functions a checker or timer relies on",
             lambda e: _lines(e.replaced)),
    Detector("precision_flags", True, "changed global precision flags (TF32, matmul precision, default dtype)",
             lambda e: _lines(e.precision)),
    Detector("global_mode", True, "left a TorchFunctionMode/TorchDispatchMode active, intercepting every op",
             lambda e: _lines(e.modes)),
    Detector("lazy_output", True, "returned a tensor subclass, meta/fake/functional tensor, not real data",
             lambda e: _lines(e.output_types)),
    Detector("output_aliases_input", True, "returned (a view of) an input instead of new memory",
             lambda e: None if e.ref_aliases_input else _lines(e.aliases)),
    Detector("inputs_modified", True, "wrote into its inputs", lambda e: None if e.ref_modifies_inputs
             else _lines(e.inputs_modified)),
    Detector("cached_results", True, "returned an earlier call's result for new inputs", lambda e: _lines(e.repeated)),
    Detector("unwritten_output", True, "left output elements unwritten (they held stale memory)",
             lambda e: _lines(e.unwritten)),
    Detector("deferred_work", True, "finished writing the output after forward returned (side stream, thread)",
             lambda e: _lines(e.late_changes)),
    Detector("process_introspection", True, "scanned the process heap during forward (looking for a result)",
             lambda e: _lines(e.introspection)),
    Detector("shape_specialized", True, "correct at the file's sizes only", lambda e: _lines(e.specialized)),
    Detector("timing_inconsistent", True, "reported times the judge's own clock contradicts",
             lambda e: _lines(e.timing)),
    Detector("timed_output_wrong", True, "wrong while being timed (fast only in the timing phase, stale after N calls)",
             lambda e: _lines(e.timed_wrong)),
    Detector("no_custom_kernel", False, "ran no kernel of its own: library and torch kernels did the work",
             lambda e: _no_custom(e)),
    Detector("background_thread", False, "left threads running after forward returned", lambda e: _lines(e.threads)),
    Detector("state_dict_mismatch", False, "Model's state_dict does not load into ModelNew (built from the same seed)",
             lambda e: e.state or None),
    Detector("poison_check_failed", False, "the poisoned-allocation pass could not run",
             lambda e: e.poison_error or None),
)
FAILING = frozenset(d.name for d in DETECTORS if d.fails)


def detect(evidence: Evidence) -> dict[str, str]:
    """{flag name: detail} for every detector that found something, in table order."""
    found = {}
    for det in DETECTORS:
        detail = det.check(evidence)
        if detail:
            found[det.name] = detail
    return found
