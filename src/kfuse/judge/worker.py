"""The candidate-side process: `python -m kfuse.judge.worker FD_IN FD_OUT`.

It imports the candidate file, builds ModelNew, calls it on the inputs the judge sends and answers with the
outputs, the buffers, its inputs after the call and the facts the probes of `cheats.py` observed. It never
sees a reference result: the judge keeps those in its own process.

Order matters: the counters are installed and the real torch/time functions captured (`Baseline`)
before the candidate is imported, so anything the candidate replaces is seen, reported and put back.
Requests arrive as a file path on FD_IN (torch.save of a dict); answers go back on FD_OUT as torch.save
bytes, which the judge loads with weights_only=True (plain data and tensors, no code). The judge-clock
exchanges (`go`, `nop`: clock.py) are one byte each way, so the judge's clock measures the call, not pickling.
It runs inside the sandbox (sandbox.py) as whatever the judge started: it can be lied to and lie, so the
judge trusts none of its reports for correctness or time.
"""

from __future__ import annotations

import importlib.util
import io
import os
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from contextlib import nullcontext
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch._dynamo  # noqa: F401 - entering any TorchDispatchMode imports it, and the import rebinds a few

# torch functions: import it now, before the Baseline is taken, not during the poisoned call
from kfuse import timing  # noqa: F401 - imported for its captured references, before any candidate
from kfuse.judge import cheats
from kfuse.verify import DTYPES, cast_inputs, flatten

_real_perf_counter = time.perf_counter
_real_sleep = time.sleep
_real_sync = torch.cuda.synchronize
_real_profile = torch.profiler.profile  # captured before the candidate is imported (and watched: cheats.WATCHED)
_CUDA_ACTIVITY = torch.profiler.ProfilerActivity.CUDA
_KFUSE_DIR = str(Path(timing.__file__).parent)  # frames from the judge itself are not the candidate's
INLINE_GO, INLINE_NOP, INLINE_DONE, INLINE_FAILED = b"G", b"N", b"D", b"E"  # judge-clock messages
LATE_WAIT_S = 0.2  # how long a deferred write (thread, side stream) gets before the second read
THREAD_JOIN_S = 1.0


class Worker:
    def __init__(self) -> None:
        wrapped = cheats.install_launch_counter()
        cheats.install_introspection_counter()
        extra = [f"{cls}.run" for cls in wrapped] + ["gc.get_objects", "gc.get_referrers"]
        self.baseline = cheats.Baseline.capture(extra)
        self.flags = cheats.precision_flags()
        self.module: Any = None
        self.models: dict[str, torch.nn.Module] = {}
        self.initial: dict[str, dict[str, torch.Tensor]] = {}
        self.bare: dict[str, torch.nn.Module] = {}  # the model before torch.compile (baseline worker)
        self.class_name = "ModelNew"
        # the judge-clock timing protocol (docs/eval.md, "Timing"): one staged input set, the kept outputs
        self.staged: tuple[str, list[torch.Tensor]] | None = None
        self.kept: list[list[torch.Tensor]] = []
        self.flush: torch.Tensor | None = None
        self.device = "cpu"
        self.dtype = torch.float32
        self.last_out_bytes = 1 << 16

    # --- integrity: replaced functions, flipped flags, active modes -- reported, then undone ------------
    def integrity(self) -> dict[str, list[str]]:
        replaced = self.baseline.replaced()
        self.baseline.restore(replaced)
        now = cheats.precision_flags()
        changed = [k for k in self.flags if now.get(k) != self.flags[k]]
        lines = cheats.changed_flags(self.flags, now)
        cheats.restore_precision(self.flags, changed)
        return {"replaced": replaced, "precision": lines, "modes": cheats.active_modes()}

    # --- requests ---------------------------------------------------------------------------------------
    def load(self, req: dict[str, Any]) -> dict[str, Any]:
        self.device, self.dtype = req["device"], DTYPES[req["precision"]]
        path = Path(req["path"])
        name = f"kfuse_candidate_{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            return {"ok": False, "stage": "compile", "error": f"{path}: cannot import"}
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # Triton and dataclasses look the module up by name
        try:
            spec.loader.exec_module(module)
        except BaseException as err:  # noqa: BLE001 - SystemExit included: the candidate must not end us
            return {"ok": False, "stage": "compile", "error": _describe(err), "facts": self.integrity()}
        self.class_name = req.get("class_name", "ModelNew")  # "Model" for the baseline worker (the REF file)
        cls = getattr(module, self.class_name, None)
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            return {"ok": False, "stage": "compile", "error": f"{path}: no {self.class_name}(nn.Module) class defined"}
        self.module = module
        return {"ok": True, "facts": self.integrity()}

    def build(self, req: dict[str, Any]) -> dict[str, Any]:
        torch.manual_seed(req["seed"])  # the reference's build seed: identical init even without its state
        model = getattr(self.module, self.class_name)(*req["init_inputs"])
        state_error = ""
        try:
            model.load_state_dict(req["state"], strict=True)
        except Exception as err:  # noqa: BLE001 - other names are allowed; it is a warning flag
            state_error = _describe(err)
            load_by_position(model, req["state"])
        model = model.to(device=self.device, dtype=self.dtype)
        self.models[req["key"]] = torch.compile(model) if req.get("compile") else model
        # each call starts from this state: buffers (BatchNorm statistics) never carry over between draws,
        # whatever the candidate names them
        self.initial[req["key"]] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.bare[req["key"]] = model
        return {"ok": True, "state_error": state_error, "facts": self.integrity()}

    def call(self, req: dict[str, Any]) -> dict[str, Any]:
        model = self.models[req["key"]]
        self.bare[req["key"]].load_state_dict(self.initial[req["key"]], strict=True)  # undo earlier buffer updates
        inputs = cast_inputs(req["inputs"], self.device, self.dtype)
        cheats.poison_allocator(self.device, self.last_out_bytes)
        threads_before = set(threading.enumerate())
        launches_before = cheats.LAUNCHES.count
        cheats.INTROSPECTION.count = 0
        mode = cheats.PoisonEmpty() if req.get("poison") else nullcontext()
        profiling = bool(req.get("profile")) and self.device == "cuda"
        profiler = _real_profile(activities=[_CUDA_ACTIVITY]) if profiling else nullcontext()
        torch.manual_seed(req["seed"])
        cheats.INTROSPECTION.armed = True
        try:
            with profiler, torch.no_grad(), mode:
                out = model(*inputs)
                if profiling:
                    _real_sync()  # every kernel of this forward has finished before the profiler stops
        finally:
            cheats.INTROSPECTION.armed = False
        gpu_kernels = cheats.gpu_kernel_names(profiler) if profiling else None
        outs = flatten(out)
        problems = cheats.output_problems(outs)
        # Read the result at once, on the current stream, as a caller would: no device-wide sync first.
        first = [_plain_copy(o) for o in outs]
        late = self._late_changes(outs, first, threads_before) if req.get("late") else []
        new_threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        self.last_out_bytes = sum(o.numel() * o.element_size() for o in first if o is not None) or self.last_out_bytes
        facts = {
            **self.integrity(),
            "output_types": problems,
            "aliases": cheats.aliases(outs, inputs),
            "late_changes": late,
            "threads": [f"thread {t.name!r} still running after forward" for t in new_threads],
            "introspection": sorted(cheats.INTROSPECTION.names) if cheats.INTROSPECTION.count else [],
            "launches": cheats.LAUNCHES.count - launches_before,
            "launch_names": sorted(cheats.LAUNCHES.names),
        }
        if gpu_kernels is not None:
            facts["gpu_kernels"] = gpu_kernels
        cheats.INTROSPECTION.names.clear()
        return {
            "ok": True,
            "outputs": None if any(o is None for o in first) else first,
            "buffers": {k: b.detach().to("cpu", copy=True) for k, b in model.named_buffers()},
            "inputs_after": [x.detach().to("cpu", copy=True) for x in inputs],
            "facts": facts,
        }

    def _late_changes(self, outs: Sequence[Any], first: Sequence[torch.Tensor | None],
                      threads_before: set[threading.Thread]) -> list[str]:
        """Wait for everything (device sync, new threads), read again: a change means work was still
        writing the output after forward returned -- a side stream or a thread the caller never waits for."""
        if self.device == "cuda":
            _real_sync()
        _real_sleep(LATE_WAIT_S)
        for t in threading.enumerate():
            if t not in threads_before and t.is_alive():
                t.join(THREAD_JOIN_S)
        lines = []
        for i, (o, f) in enumerate(zip(outs, first)):
            again = _plain_copy(o)
            if f is not None and again is not None and not cheats.bitwise_equal(f, again):
                lines.append(f"output {i} changed after forward returned")
        return lines

    # --- timing by the judge's clock: stage (untimed), go (timed by the judge), kept (after the clock) ----
    def stage(self, req: dict[str, Any]) -> dict[str, Any]:
        """Put one fresh input set on the device and evict L2; nothing of the model runs."""
        self.bare[req["key"]].load_state_dict(self.initial[req["key"]], strict=True)
        self.staged = (req["key"], cast_inputs(req["inputs"], self.device, self.dtype))
        if self.device == "cuda":
            if self.flush is None:
                self.flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
            self.flush.zero_()
            _real_sync()
        return {"ok": True}

    def go(self) -> None:
        """The timed call: forward on the staged inputs, then wait for the whole device (side streams too).
        The output is copied at once, so nothing can change it before the judge reads it."""
        key, inputs = self.staged
        with torch.no_grad():
            out = self.models[key](*inputs)
        if self.device == "cuda":
            _real_sync()
        self.kept.append([o.detach().clone() for o in flatten(out)])

    def nop(self) -> None:
        """The protocol's own cost (two pipe messages and a device sync), subtracted from every timed call."""
        if self.device == "cuda":
            _real_sync()

    def kept_outputs(self, req: dict[str, Any]) -> dict[str, Any]:
        """After the clock: the outputs of the timed calls the judge picked (it picks after they ran); every
        kept output is dropped."""
        picked = [[_plain_copy(o) for o in self.kept[i]] for i in req["indices"] if 0 <= i < len(self.kept)]
        self.kept.clear()
        self.staged = None
        return {"ok": True, "outputs_list": picked, "facts": self.integrity()}

    def time(self, req: dict[str, Any]) -> dict[str, Any]:
        model = self.models[req["key"]]
        inputs = cast_inputs(req["inputs"], self.device, self.dtype)

        def fn() -> Any:
            with torch.no_grad():
                return model(*inputs)

        start = _real_perf_counter()
        result = timing.time_cuda(fn, warmup=req["warmup"], runs=req["runs"])
        wall_ms = (_real_perf_counter() - start) * 1e3
        return {"ok": True, "timing": result.to_json(), "wall_ms": wall_ms,
                "facts": {**self.integrity(), "timing_replaced": timing.replaced()}}


def load_by_position(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
    """Model's state into a ModelNew that names its tensors differently but has them in the same order and
    shapes: the same numbers, so an honest renaming is judged on its arithmetic."""
    own = model.state_dict()
    if len(own) != len(state) or any(a.shape != b.shape for a, b in zip(own.values(), state.values())):
        return False
    with torch.no_grad():
        for a, b in zip(own.values(), state.values()):
            a.copy_(b.to(dtype=a.dtype))
    return True


def _plain_copy(t: Any) -> torch.Tensor | None:
    """A plain CPU tensor with the output's values, or None when it has no readable data."""
    try:
        plain = t.detach()
        if type(plain) is not torch.Tensor:
            plain = plain.as_subclass(torch.Tensor)
        return plain.to("cpu", copy=True).contiguous()
    except Exception:  # noqa: BLE001
        return None


def _describe(err: BaseException) -> str:
    """The exception and the candidate-side frame it came from, in a few lines."""
    lines = str(err).strip().splitlines()
    head = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith(_KFUSE_DIR)]
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return head + where


def serve(fd_in: int, fd_out: int) -> None:
    rx, tx = Connection(fd_in, writable=False), Connection(fd_out, readable=False)
    worker = Worker()
    handlers = {"load": worker.load, "build": worker.build, "call": worker.call, "time": worker.time,
                "stage": worker.stage, "kept": worker.kept_outputs}
    quick = {INLINE_GO: worker.go, INLINE_NOP: worker.nop}
    tx.send_bytes(_dump({"ok": True, "ready": True, "pid": os.getpid()}))
    while True:
        try:
            message = rx.recv_bytes()
        except EOFError:
            return
        if message in quick:  # timed by the judge: no file, no pickling, one byte each way
            try:
                quick[message]()
                tx.send_bytes(INLINE_DONE)
            except BaseException as err:  # noqa: BLE001
                tx.send_bytes(INLINE_FAILED + _describe(err).encode()[:1000])
            continue
        # written by the judge, which we trust; mapped, not copied (a timed call's inputs can be large)
        req = torch.load(message.decode(), weights_only=False, mmap=True)
        if req["op"] == "quit":
            return
        try:
            answer = handlers[req["op"]](req)
        except BaseException as err:  # noqa: BLE001 - any candidate failure is an answer, not our death
            answer = {"ok": False, "error": _describe(err)}
            try:
                answer["facts"] = worker.integrity()
            except Exception:  # noqa: BLE001
                pass
        tx.send_bytes(_dump(answer))
        del answer, req  # keep no earlier result alive for a candidate to find


def _dump(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
