"""Shared fixtures for the judge tests: every planted candidate is evaluated once per session, two at a
time (each in its own worker process), and the tests read the records."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kfuse.judge import sandbox
from kfuse.judge.evaluate import EvalConfig, EvalRecord, evaluate

# the judge's disk caches (baseline timings, compilation) stay inside this test session
if "KFUSE_JUDGE_CACHE_DIR" not in os.environ:
    os.environ["KFUSE_JUDGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="kfuse-judge-cache-")
    atexit.register(shutil.rmtree, os.environ["KFUSE_JUDGE_CACHE_DIR"], ignore_errors=True)
HERE = Path(__file__).parent
PROBLEMS = HERE / "problems"
CANDIDATES = HERE / "candidates"

# candidate -> problem it answers (default linear_relu)
PROBLEM_OF = {name: "scale_relu" for name in (
    "honest_scale", "alias_input", "escape_judge_process", "escape_files", "escape_limits", "malformed_answer",
    "huge_output", "markup_error", "timing_input_cache", "timing_phase", "timing_stale", "timing_forged_timer",
    "timing_precompute")}
PROBLEM_OF["honest_renamed_buffers"] = "batchnorm"
# judged by their own tests, with paths, ports, sizes or limits filled in
TEMPLATES = {"escape_files", "escape_limits", "rewrite_reference", "escape_cpu"}
# timing_* are judged with timing on (test_timing.py), *_gpu on the GPU only (test_gpu.py)
CPU_CANDIDATES = sorted(p.stem for p in CANDIDATES.glob("*.py")
                        if not p.stem.endswith("_gpu") and p.stem not in TEMPLATES and not p.stem.startswith("timing_"))
# Where bubblewrap cannot start (no user namespaces), the cheat tests still run, unsandboxed, and the
# sandbox's own tests are skipped with this reason.
NO_SANDBOX = sandbox.unavailable()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"sandbox unavailable: {NO_SANDBOX}")
# Small enough for CI on 2 cores; `hang` needs a short timeout, everyone else a generous one.
FAST = EvalConfig(device="cpu", trials=3, seed=1234, timeout_s=120, sandboxed=NO_SANDBOX is None)
TIMEOUTS = {"hang": 12.0}


def problem_path(candidate: str) -> Path:
    return PROBLEMS / f"{PROBLEM_OF.get(candidate, 'linear_relu')}.py"


def _evaluate(name: str) -> EvalRecord:
    cfg = EvalConfig(**{**FAST.__dict__, "timeout_s": TIMEOUTS.get(name, FAST.timeout_s)})
    return evaluate(problem_path(name), CANDIDATES / f"{name}.py", cfg)


@pytest.fixture(scope="session")
def records() -> dict[str, EvalRecord]:
    # Threads are enough: the work happens in the worker processes; the judge's references take a lock.
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        return dict(zip(CPU_CANDIDATES, pool.map(_evaluate, CPU_CANDIDATES)))


@pytest.fixture
def suite_folders(tmp_path: Path) -> Callable[[Mapping[str, tuple[str, str | None]]], tuple[Path, Path]]:
    """eval-suite's two folders under tmp_path (refs/, cands/) from {name: (problem, candidate or None)}: the
    problem file copied to refs/NAME.py, the planted candidate (if any) to cands/NAME.py."""

    def make(pairs: Mapping[str, tuple[str, str | None]]) -> tuple[Path, Path]:
        refs, cands = tmp_path / "refs", tmp_path / "cands"
        refs.mkdir()
        cands.mkdir()
        for name, (problem, candidate) in pairs.items():
            shutil.copy(PROBLEMS / f"{problem}.py", refs / f"{name}.py")
            if candidate is not None:
                shutil.copy(CANDIDATES / f"{candidate}.py", cands / f"{name}.py")
        return refs, cands

    return make
