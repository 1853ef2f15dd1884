"""The worker starts before it is needed (issue 21): while the judge computes the references (and, in a suite,
while the previous candidate is judged), yet the candidate's code reaches it only once every reference exists.

Evidence, not call order: the worker process is alive and has said it is ready while the references are still
being computed, its request folder then holds no candidate, and the candidate itself reports (in the error it
raises at import) what it found beside its own file: a marker the test writes there only after the last
reference was computed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kfuse.judge import evaluate as evaluate_module
from kfuse.judge import sandbox
from kfuse.judge.evaluate import EvalConfig, evaluate
from kfuse.judge.ipc import WorkerHandle
from kfuse.judge.suite import run_suite

PROBLEMS = Path(__file__).parent / "problems"
CFG = EvalConfig(device="cpu", trials=1, seed=5, timeout_s=120, sandboxed=sandbox.unavailable() is None)
MARKER = "references-done"
# Lists the folder its own file was put in (the worker's request folder), as the error of its import.
REPORTER = ("from pathlib import Path\n"
            "raise RuntimeError('beside me: ' + ' '.join(sorted(p.name for p in Path(__file__).parent.iterdir())))\n")


class Spy:
    """Every worker the judge starts (and the thread that started it), and a hook at the end of each `prepare`
    (every reference of one candidate computed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, after_references) -> None:
        self.workers: list[tuple[WorkerHandle, str]] = []
        self.prepared = 0
        real_init, real_prepare = WorkerHandle.__init__, evaluate_module.prepare

        def init(handle: WorkerHandle, **kwargs) -> None:
            real_init(handle, **kwargs)
            self.workers.append((handle, threading.current_thread().name))

        def prepare(*args, **kwargs):
            planned = real_prepare(*args, **kwargs)
            after_references(self)
            return planned

        monkeypatch.setattr(WorkerHandle, "__init__", init)
        monkeypatch.setattr(evaluate_module, "prepare", prepare)

    def live(self) -> list[WorkerHandle]:
        return [w for w, _ in self.workers if w.proc.poll() is None]


def eventually(condition, within_s: float = 90.0) -> bool:
    """True once `condition()` holds (the prestart's own thread reads the ready message), False at the deadline."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def candidate_files(worker: WorkerHandle) -> list[str]:
    return [p.name for p in worker.io_dir.iterdir() if p.suffix == ".py"]


def test_worker_starts_during_the_references_and_gets_the_candidate_after(tmp_path, monkeypatch):
    cand = tmp_path / "scale_relu.py"
    cand.write_text(REPORTER)
    seen: dict[str, object] = {}

    def after_references(spy: Spy) -> None:
        (worker, _), = spy.workers  # started before the references, not after them
        # still inside the references: the worker comes up meanwhile (its ready message waits in the pipe)
        seen["ready"] = worker._rx.poll(90)
        seen["alive"] = worker.proc.poll() is None
        seen["candidate_files"] = candidate_files(worker)
        (worker.io_dir / MARKER).write_text("")

    Spy(monkeypatch, after_references)
    rec = evaluate(PROBLEMS / "scale_relu.py", cand, CFG)
    assert seen == {"ready": True, "alive": True, "candidate_files": []}
    assert not rec.compiled and rec.error and "beside me:" in rec.error, rec.error
    assert MARKER in rec.error.split() and "scale_relu.py" in rec.error.split()  # imported after the references
    assert rec.phases_s["worker_ready_wait"] < 1.0, rec.phases_s  # it was ready: the start overlapped them


def test_suite_starts_the_next_worker_while_the_previous_candidate_is_judged(tmp_path, monkeypatch, suite_folders):
    refs, cands = suite_folders({"a": ("scale_relu", "honest_scale"), "b": ("scale_relu", None)})
    (cands / "b.py").write_text(REPORTER)
    seen: dict[str, object] = {}

    def prestarted(spy: Spy) -> list[WorkerHandle]:
        return [w for w, thread in spy.workers if thread.startswith("kfuse-prestart")]

    def after_references(spy: Spy) -> None:
        spy.prepared += 1
        if spy.prepared == 2:  # b's references are done: only now may b's code run
            for worker in prestarted(spy):
                (worker.io_dir / MARKER).write_text("")

    def on_record(rec) -> None:
        if rec.problem == "a":  # a is judged, b not begun: b's worker is up already, and has no candidate
            seen["after_a"] = [(w.proc.poll() is None, eventually(lambda: w.ready), candidate_files(w))
                               for w in prestarted(spy)]

    spy = Spy(monkeypatch, after_references)
    result = run_suite(refs, cands, CFG, tmp_path / "k.db", on_record=on_record)
    a, b = result.records
    assert a.correct, a.error
    assert seen["after_a"] == [(True, True, [])], seen
    assert len(spy.workers) == 2 and spy.live() == []  # a's own and b's prestarted one, both ended
    assert "beside me:" in (b.error or "") and MARKER in b.error.split() and "b.py" in b.error.split(), b.error
    assert b.phases_s["worker_ready_wait"] < 1.0, b.phases_s


def test_an_interrupted_suite_ends_the_prestarted_worker(tmp_path, monkeypatch, suite_folders):
    refs, cands = suite_folders({name: ("scale_relu", "honest_scale") for name in ("a", "b")})
    spy = Spy(monkeypatch, lambda spy: None)

    def die(record):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_suite(refs, cands, CFG, tmp_path / "k.db", on_record=die)
    assert len(spy.workers) == 2 and spy.live() == []
