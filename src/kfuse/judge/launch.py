"""The candidate's worker process, started before it is handed any code: by `evaluate` while it computes the
references, or (eval-suite) by `prestart` while earlier candidates are judged. Starting means the sandbox,
`import torch` and, on the GPU, the CUDA context and CUPTI; the candidate's bytes reach the worker only later
(`WorkerHandle.hand_over`), once every reference exists.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kfuse.errors import KfuseError
from kfuse.judge import cache
from kfuse.judge.clock import GATE
from kfuse.judge.ipc import WorkerHandle

if TYPE_CHECKING:
    from kfuse.judge.evaluate import EvalConfig


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
