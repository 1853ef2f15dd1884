"""The judge's handle on one worker process: start it, send requests, enforce the timeout, survive crashes.

Requests travel as files (torch.save) whose path goes down a pipe, so a large input never blocks the judge
on a worker that stopped reading. Answers come back on a second pipe and are loaded with
`weights_only=True`: a candidate can send wrong numbers, never code for the judge to run.
The worker gets its own session (process group), so a kill also ends anything the candidate started.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

LOG_TAIL_CHARS = 1500


class WorkerFailure(Exception):
    """The worker timed out or died; `str()` says which, with the tail of its output."""


class WorkerHandle:
    def __init__(self, *, interpret: bool, timeout_s: float) -> None:
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.tmp = tempfile.TemporaryDirectory(prefix="kfuse-judge-")
        self.log_path = Path(self.tmp.name) / "worker.log"
        self._n = 0
        env = dict(os.environ)
        if interpret:
            env["TRITON_INTERPRET"] = "1"  # CPU: Triton kernels run in the interpreter
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kfuse.judge.worker", str(down_r), str(up_w)],
                pass_fds=(down_r, up_w), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=self.tmp.name, start_new_session=True)
        os.close(down_r)
        os.close(up_w)
        self._tx = Connection(down_w, readable=False)
        self._rx = Connection(up_r, writable=False)
        try:
            self._receive()  # the worker's "ready": imports done, counters installed
        except WorkerFailure:
            self.close()
            raise

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        self._n += 1
        path = Path(self.tmp.name) / f"req{self._n}.pt"
        torch.save({"op": op, **fields}, path)
        try:
            self._tx.send_bytes(str(path).encode())
        except (BrokenPipeError, OSError):
            raise WorkerFailure(self._died()) from None
        return self._receive()

    def _receive(self) -> dict[str, Any]:
        remaining = self.deadline - time.monotonic()
        try:
            ready = remaining > 0 and self._rx.poll(remaining)
        except (EOFError, OSError):
            ready = True  # poll reports a closed pipe as readable on some platforms; recv says EOF
        if not ready:
            self.kill()
            raise WorkerFailure(f"timeout: no answer within {self.timeout_s:g} s (worker killed){self._tail()}")
        try:
            raw = self._rx.recv_bytes()
        except (EOFError, OSError):
            raise WorkerFailure(self._died()) from None
        try:
            answer = torch.load(io.BytesIO(raw), weights_only=True)
        except Exception as err:  # noqa: BLE001 - a worker answer we cannot read is a failed candidate
            raise WorkerFailure(f"unreadable answer from the worker: {type(err).__name__}") from None
        if not isinstance(answer, dict):
            raise WorkerFailure("malformed answer from the worker")
        return answer

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
        else:
            what = f"exited with code {code}"
        return f"worker crashed: {what}{self._tail()}"

    def _tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip()
        except OSError:
            return ""
        return f"\n--- worker output (tail) ---\n{text[-LOG_TAIL_CHARS:]}" if text else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # our child's own group: it and what it started
            except ProcessLookupError:
                pass
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._n += 1
                path = Path(self.tmp.name) / f"req{self._n}.pt"
                torch.save({"op": "quit"}, path)
                self._tx.send_bytes(str(path).encode())
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for conn in (self._tx, self._rx):
            conn.close()
        self.tmp.cleanup()

    def __enter__(self) -> "WorkerHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
