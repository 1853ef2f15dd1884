"""The judge's handle on one worker process: start it (in the sandbox), send requests, enforce the timeout,
survive crashes, and treat every answer as hostile data.

Requests travel as files (torch.save) in a folder the worker sees read-only, whose path goes down a pipe,
so a large input never blocks the judge on a worker that stopped reading. Answers come back on a second
pipe, at most `cap` bytes each (a larger one ends the worker), are loaded with `weights_only=True` (data,
never code) and checked against the answer schema (`check_answer`) before the judge reads a field.
The worker's output goes to a log outside its sandbox; the judge reads at most its last LOG_TAIL_BYTES,
never through a symlink.
"""

from __future__ import annotations

import io
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kfuse.judge import sandbox, staging
from kfuse.judge.worker import WARM_CUDA

if TYPE_CHECKING:
    from kfuse.judge.stage_area import Area

LOG_TAIL_BYTES = 1500
ANSWER_FLOOR_BYTES = 8 << 20  # load/build answers and small outputs
MAX_ITEMS = 64  # per fact list, outputs, buffers
MAX_TEXT = 400  # per fact line or error
STAGE_PATHS = ("registered", "copied")  # staging.device_sets: how a stage's bytes reached the worker's device
FACT_LISTS = ("replaced", "precision", "modes", "output_types", "aliases", "late_changes", "threads",
              "introspection", "launch_names", "timing_replaced", "gpu_kernels")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class WorkerFailure(Exception):
    """The worker timed out, died or answered out of schema; `str()` says which, with the tail of its log."""


def clean_text(text: Any, limit: int = MAX_TEXT) -> str:
    """A candidate-supplied string made safe to store and print: no control characters, bounded length."""
    s = _CONTROL.sub("?", str(text))
    return s if len(s) <= limit else s[: limit - 3] + "..."


# --- the answer schema ---------------------------------------------------------------------------------


def _tensor(t: Any, what: str) -> torch.Tensor:
    if type(t) is not torch.Tensor or t.layout != torch.strided or t.device.type != "cpu":
        raise WorkerFailure(f"malformed answer from the worker: {what} is not a plain CPU tensor")
    return t


def _tensors(v: Any, what: str) -> list[torch.Tensor]:
    if not isinstance(v, list) or len(v) > MAX_ITEMS:
        raise WorkerFailure(f"malformed answer from the worker: {what} is not a list of at most {MAX_ITEMS} tensors")
    return [_tensor(t, f"{what}[{i}]") for i, t in enumerate(v)]


def _facts(v: Any) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise WorkerFailure("malformed answer from the worker: facts is not a mapping")
    out: dict[str, Any] = {}
    for key in FACT_LISTS:
        items = v.get(key) or []
        if not isinstance(items, list):
            raise WorkerFailure(f"malformed answer from the worker: facts.{key} is not a list")
        limit = 4096 if key == "gpu_kernels" else MAX_ITEMS
        out[key] = [clean_text(x) for x in items[:limit]]
    if "gpu_kernels" not in v:
        out["gpu_kernels"] = None  # not profiled (the CPU, or a call the judge did not profile)
    launches = v.get("launches", 0)
    if type(launches) is not int or launches < 0:
        raise WorkerFailure("malformed answer from the worker: facts.launches is not a count")
    out["launches"] = launches
    return out


def check_answer(op: str, answer: Any) -> dict[str, Any]:
    """The answer with every field the judge reads present and of the right type; anything else raises
    WorkerFailure (the candidate's record then carries the error, the judge goes on)."""
    if not isinstance(answer, dict) or type(answer.get("ok")) is not bool:
        raise WorkerFailure("malformed answer from the worker: not a mapping with a boolean 'ok'")
    out: dict[str, Any] = {"ok": answer["ok"], "facts": _facts(answer.get("facts"))}
    if "error" in answer:
        out["error"] = clean_text(answer["error"], 2000)
    if not answer["ok"]:
        return out
    if op == "build":
        out["state_error"] = clean_text(answer.get("state_error") or "", 2000)
    elif op == "call":
        outputs = answer.get("outputs")
        out["outputs"] = None if outputs is None else _tensors(outputs, "outputs")
        out["inputs_after"] = _tensors(answer.get("inputs_after"), "inputs_after")
        buffers = answer.get("buffers")
        if not isinstance(buffers, dict) or len(buffers) > 4 * MAX_ITEMS:
            raise WorkerFailure("malformed answer from the worker: buffers is not a mapping")
        out["buffers"] = {clean_text(k): _tensor(t, f"buffer {clean_text(k)}") for k, t in buffers.items()}
    elif op == "kept":
        lists = answer.get("outputs_list")
        if not isinstance(lists, list) or len(lists) > MAX_ITEMS:
            raise WorkerFailure("malformed answer from the worker: outputs_list is not a list")
        out["outputs_list"] = [_tensors(x, "kept outputs") for x in lists]
    elif op == "stage":
        out["via"] = answer.get("via") if answer.get("via") in STAGE_PATHS else "unknown"
    elif op == "time":
        for key in ("wall_ms",):
            if key in answer and not (isinstance(answer[key], float) and math.isfinite(answer[key])):
                raise WorkerFailure(f"malformed answer from the worker: {key} is not a finite number")
        out.update({k: answer[k] for k in ("wall_ms",) if k in answer})
        timing = answer.get("timing")
        if timing is not None:
            out["timing"] = _timing(timing)
    return out


def _timing(t: Any) -> dict[str, Any]:
    if not isinstance(t, dict):
        raise WorkerFailure("malformed answer from the worker: timing is not a mapping")
    out: dict[str, Any] = {"available": bool(t.get("available")), "reason": clean_text(t.get("reason") or "")}
    for k in ("median_ms", "min_ms", "max_ms", "p10_ms", "p90_ms"):
        v = t.get(k)
        out[k] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
    n = t.get("n")
    out["n"] = n if type(n) is int and n >= 0 else 0
    return out


def tensor_bytes(tensors: Any) -> int:
    """Bytes of every tensor in a (nested) list/dict: what an honest answer about them weighs."""
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, Mapping):
        return sum(tensor_bytes(v) for v in tensors.values())
    if isinstance(tensors, (list, tuple)):
        return sum(tensor_bytes(v) for v in tensors)
    return 0


# --- the handle ------------------------------------------------------------------------------------------


class WorkerHandle:
    """One worker process, started before the judge needs it: the constructor returns at once, while the worker
    imports torch (and, with `warm_cuda`, creates its CUDA context and starts CUPTI) in the sandbox; the judge
    computes its references meanwhile, then `wait_ready` and `hand_over` the candidate's code. The worker
    sees no candidate until `hand_over` writes it into its request folder."""

    def __init__(self, *, interpret: bool, timeout_s: float, isolated: bool = True, gpu: bool = False,
                 limits: sandbox.Limits = sandbox.Limits(), compile_cache: Path | None = None,
                 warm_cuda: bool = False) -> None:
        self.deadline = time.monotonic() + timeout_s  # set again by `wait_ready` (start) and `hand_over` (candidate)
        self.timeout_s = timeout_s
        self.tmp = tempfile.TemporaryDirectory(prefix="kfuse-judge-", dir=memory_folder())
        root = Path(self.tmp.name)
        self.io_dir = root / "io"  # the worker's view: requests and, once handed over, its copy of the candidate
        self.io_dir.mkdir()
        self.log_path = root / "worker.log"
        self.candidate: Path | None = None
        self.ready = False
        self.warmup_s = 0.0
        self._n = 0
        self.cgroup: Path | None = None
        self.spin = gpu  # judge-clock exchanges busy-wait for the answer (see `quick`)
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        limits = sandbox.limits_for(timeout_s, limits)
        worker = [sandbox.python(), "-m", "kfuse.judge.worker", str(down_r), str(up_w)]
        if warm_cuda:
            worker.append(WARM_CUDA)
        if isolated:
            box = sandbox.Sandbox(io_dir=self.io_dir, gpu=gpu, interpret=interpret, limits=limits,
                                  compile_cache=compile_cache)
            self.cgroup = sandbox.pids_cgroup(limits.processes)
            command = sandbox.enter_cgroup_command(self.cgroup, sandbox.argv(box, worker))
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            self.worker_io = sandbox.IO_DIR
        else:
            # no boundary, but the same kernel limits where prlimit exists
            command = [*sandbox.prlimit(limits), *worker] if shutil.which("prlimit") else worker
            env = dict(os.environ)
            if interpret:
                env["TRITON_INTERPRET"] = "1"  # CPU: Triton kernels run in the interpreter
            if compile_cache is not None:
                env.update({k: v.replace(sandbox.COMPILE_CACHE, str(compile_cache)) for k, v in
                            sandbox.environment(sandbox.Sandbox(self.io_dir, False, False, limits)).items()
                            if k.endswith(("CACHE_DIR", "EXTENSIONS_DIR", "CACHE_HOME"))})
            self.worker_io = str(self.io_dir)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command, pass_fds=(down_r, up_w), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=self.io_dir, start_new_session=True)
        os.close(down_r)
        os.close(up_w)
        self._tx = Connection(down_w, readable=False)
        self._rx = Connection(up_r, writable=False)

    def wait_ready(self) -> float:
        """Wait (at most timeout_s) for the worker's ready message: torch imported, counters installed,
        CUDA warmed where asked. Returns the seconds its CUDA warm-up took, by its own clock (no candidate code
        has run in it yet). A worker that dies or stays silent raises WorkerFailure."""
        if not self.ready:
            # the start's limit runs from when the judge needs the worker: the references' seconds are not its own
            self.deadline = time.monotonic() + self.timeout_s
            ready = self._receive(ANSWER_FLOOR_BYTES)
            if not isinstance(ready, dict) or ready.get("ready") is not True:
                raise WorkerFailure("malformed answer from the worker: no ready message")
            warmup = ready.get("warmup_s", 0.0)
            self.warmup_s = float(warmup) if isinstance(warmup, float) and math.isfinite(warmup) else 0.0
            self.ready = True
        return self.warmup_s

    def hand_over(self, name: str, source: bytes) -> str:
        """Give the ready worker the candidate: its bytes (read once by the judge) written into the request folder
        only now, and the candidate's own timeout starting now. Returns the path the worker imports it from."""
        self.wait_ready()
        self.candidate = self.io_dir / Path(name).name  # the worker never sees the user's path or its folder
        self.candidate.write_bytes(source)
        self.deadline = time.monotonic() + self.timeout_s
        return f"{self.worker_io}/{self.candidate.name}"

    def request(self, op: str, cap: int = ANSWER_FLOOR_BYTES, **fields: Any) -> dict[str, Any]:
        """Send one request and return its checked answer; at most `cap` bytes are accepted. The request
        file is removed once answered (the worker has mapped or read it by then)."""
        path = self.send(op, **fields)
        try:
            return check_answer(op, self._receive(cap))
        finally:
            path.unlink(missing_ok=True)

    def stage(self, key: str, calls: Sequence[int], draw: Callable[[int], list[Any]], reserve: int = 0,
              area: Area | None = None) -> str:
        """The input sets of a batch of timed calls (`draw(i)` for each i in `calls`) put on the worker's device,
        untimed: written raw into one file that the worker maps, the evaluation's `area` (stage_area.py) linked
        into the request folder where it is ready and large enough, else a fresh file (staging.py). Returns how
        the worker says the bytes reached its device (staging.device_sets; the worker's word, deciding nothing)."""
        self._n += 1
        data = self.io_dir / f"stage{self._n}.bin"
        try:
            manifest = self._write_stage(data, calls, draw, area)
            answer = self.request("stage", key=key, reserve=reserve, data=f"{self.worker_io}/{data.name}",
                                  manifest=manifest.to_json())
            return answer.get("via", "unknown")
        finally:
            data.unlink(missing_ok=True)

    @staticmethod
    def _write_stage(data: Path, calls: Sequence[int], draw: Callable[[int], list[Any]],
                     area: Area | None) -> staging.Manifest:
        if area is not None and area.ready():
            try:
                manifest = area.write(draw(i) for i in calls)
                area.link(data)
                return manifest
            except (staging.TooLarge, OSError):  # a set larger than planned, or another filesystem
                data.unlink(missing_ok=True)
        return staging.write_sets(data, (draw(i) for i in calls))

    def send(self, op: str, **fields: Any) -> Path:
        self._n += 1
        name = f"req{self._n}.pt"
        torch.save({"op": op, **fields}, self.io_dir / name)
        try:
            self._tx.send_bytes(f"{self.worker_io}/{name}".encode())
        except (BrokenPipeError, OSError):
            raise WorkerFailure(self._died()) from None
        return self.io_dir / name

    def quick(self, message: bytes) -> float:
        """One judge-clock exchange (worker.INLINE_GO / INLINE_NOP): the seconds between sending it and the
        worker's one-byte reply, on the judge's clock. A failure inside raises WorkerFailure."""
        start = time.perf_counter()
        try:
            self._tx.send_bytes(message)
        except (BrokenPipeError, OSError):
            raise WorkerFailure(self._died()) from None
        if self.spin:
            self._spin_for_answer()
        reply = self._receive_raw(4096)
        elapsed = time.perf_counter() - start
        if reply != b"D":
            text = clean_text(reply[1:].decode(errors="replace"), 1000) if reply[:1] == b"E" else "malformed reply"
            raise WorkerFailure(f"timed call failed: {text}")
        return elapsed

    def _spin_for_answer(self) -> None:
        """Busy-wait until the answer is there (or the deadline passes): a thread asleep in poll() is scheduled
        again up to ~0.2 ms after the answer arrives (H200 machine, benchmarks/judge/wakeup_diag.py), and the
        judge's clock would count it as the candidate's. Only for GPU work: on the CPU the worker needs the cores."""
        while not self._rx.poll(0):
            if time.monotonic() > self.deadline:
                return

    def _receive(self, cap: int) -> Any:
        raw = self._receive_raw(cap)
        try:
            return torch.load(io.BytesIO(raw), weights_only=True)
        except Exception as err:  # noqa: BLE001 - a worker answer we cannot read is a failed candidate
            raise WorkerFailure(f"unreadable answer from the worker: {type(err).__name__}") from None
        finally:
            del raw

    def _receive_raw(self, cap: int) -> bytes:
        remaining = self.deadline - time.monotonic()
        try:
            ready = remaining > 0 and self._rx.poll(remaining)
        except (EOFError, OSError):
            ready = True  # poll reports a closed pipe as readable on some platforms; recv says EOF
        if not ready:
            self.kill()
            raise WorkerFailure(f"timeout: no answer within {self.timeout_s:g} s (worker killed){self._tail()}")
        try:
            raw = self._rx.recv_bytes(cap)
        except EOFError:
            raise WorkerFailure(self._died()) from None
        except OSError as err:
            if "bad message length" in str(err):
                self.kill()
                raise WorkerFailure(f"answer larger than {cap} bytes (worker killed)") from None
            raise WorkerFailure(self._died()) from None
        return raw

    def _died(self) -> str:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if code is not None and code < 0:
            try:
                what = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                what = f"killed by signal {-code}"
        elif code is not None and code > 128:
            # bubblewrap reports a child killed by signal N as exit code 128 + N
            try:
                what = f"killed by {signal.Signals(code - 128).name}"
            except ValueError:
                what = f"exited with code {code}"
        else:
            what = f"exited with code {code}"
        return f"worker crashed: {what}{self._tail()}"

    def _tail(self) -> str:
        text = read_tail(self.log_path, LOG_TAIL_BYTES)
        return f"\n--- worker output (tail) ---\n{text}" if text else ""

    def kill(self) -> None:
        """End the worker and everything it started: bubblewrap's pid namespace dies with it."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def close(self) -> None:
        if self.ready and self.proc.poll() is None:  # a worker still starting is simply killed
            try:
                self.send("quit")
                self.proc.wait(timeout=5)
            except (OSError, WorkerFailure, subprocess.TimeoutExpired):
                pass
        self.kill()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever is left in the group (unsandboxed runs)
        except (ProcessLookupError, PermissionError):
            pass
        for conn in (self._tx, self._rx):
            conn.close()
        sandbox.remove_cgroup(self.cgroup)
        self.tmp.cleanup()

    def __enter__(self) -> "WorkerHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SHM = "/dev/shm"
SHM_FREE_BYTES = 8 << 30  # requests (a timed call's fresh inputs) go through RAM where this much is free


def memory_folder() -> str | None:
    """A RAM-backed folder for requests when the machine has room there, else the default temp folder:
    every timed call ships fresh inputs, and a disk would slow that down."""
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    return SHM if os.access(SHM, os.W_OK) and st.f_bavail * st.f_frsize >= SHM_FREE_BYTES else None


def read_tail(path: Path, limit: int) -> str:
    """The last `limit` bytes of a regular file, opened without following a symlink; '' otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        os.lseek(fd, max(0, st.st_size - limit), os.SEEK_SET)
        data = os.read(fd, limit)
    finally:
        os.close(fd)
    return _CONTROL.sub("", data.decode("utf-8", errors="replace")).strip()
