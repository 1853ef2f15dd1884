"""The privilege boundary: planted candidates try to reach the judge, the user's files, the environment,
the network, the machine's resources, and to outlive the judge. Each one reports a success as an error
with "ESCAPED"; docs/eval.md's attack table shows what each did to the judge before the sandbox."""

from __future__ import annotations

import os
import signal
import socket
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kfuse.cli import app
from kfuse.errors import KfuseError
from kfuse.judge import cache, sandbox
from kfuse.judge import evaluate as evaluate_module
from kfuse.judge.evaluate import EvalConfig, evaluate

HERE = Path(__file__).parent
PROBLEMS, CANDIDATES = HERE / "problems", HERE / "candidates"
NO_SANDBOX = sandbox.unavailable()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"sandbox unavailable: {NO_SANDBOX}")
FAST = EvalConfig(device="cpu", trials=2, seed=1234, timeout_s=120, sandboxed=NO_SANDBOX is None)
GIB = 1 << 30
DAEMON_CMDLINE = b"sleep\x0031415.9265\x00"


def fill(template: str, dest: Path, **values: object) -> Path:
    """A planted candidate with its placeholders (`NAME = ...` lines) set to `values`."""
    lines = (CANDIDATES / f"{template}.py").read_text().splitlines()
    for i, line in enumerate(lines):
        name = line.split(" = ")[0]
        if name in values and " = " in line:
            lines[i] = f"{name} = {values[name]!r}"
    dest.write_text("\n".join(lines) + "\n")
    return dest


def daemons() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/cmdline").read_bytes() == DAEMON_CMDLINE:
                found.append(int(entry))
        except OSError:
            pass
    return found


def test_refuses_in_one_line_where_the_sandbox_cannot_start(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "unavailable", lambda: "user namespaces are disabled (test)")
    with pytest.raises(KfuseError, match="--unsandboxed"):
        evaluate(PROBLEMS / "scale_relu.py", CANDIDATES / "honest_scale.py", FAST)
    res = CliRunner().invoke(app, ["eval", str(PROBLEMS / "scale_relu.py"), str(CANDIDATES / "honest_scale.py"),
                                   "--device", "cpu"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "sandbox cannot start here: user namespaces are disabled (test)" in res.output
    assert evaluate_module.sandbox_refusal() is not None


def test_unsandboxed_run_is_recorded(tmp_path):
    out = tmp_path / "rec.json"
    res = CliRunner().invoke(app, ["eval", str(PROBLEMS / "scale_relu.py"), str(CANDIDATES / "honest_scale.py"),
                                   "--device", "cpu", "--trials", "1", "--unsandboxed", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert '"sandbox": "none (--unsandboxed)"' in out.read_text() and "sandbox: none" in res.output


@needs_sandbox
def test_python_reached_through_a_folder_the_sandbox_lacks(monkeypatch):
    """`../.venv/bin/python -m kfuse eval` from a subfolder: sys.executable runs through a folder that is not
    bound in the sandbox (the worker crashed: bwrap could not exec it)."""
    exe = Path(sys.executable).absolute()
    detour = HERE / os.path.relpath(exe, HERE)  # HERE/../../.venv/bin/python: through tests/judge
    assert ".." in detour.parts and detour.exists()
    monkeypatch.setattr(sys, "executable", str(detour))
    rec = evaluate(PROBLEMS / "scale_relu.py", CANDIDATES / "honest_scale.py", FAST)
    assert rec.correct and rec.error is None, rec.error


@needs_sandbox
def test_a_files_xdg_cache_is_kept_across_runs(tmp_path, monkeypatch):
    """A tool's cache under $XDG_CACHE_HOME (kfuse's autotuner keeps its choices there) is the file's own compile
    cache: the second judging of the same file finds what the first one wrote, and the host holds it there."""
    monkeypatch.setenv("KFUSE_JUDGE_CACHE_DIR", str(tmp_path / "judge-cache"))
    cand = tmp_path / "cand.py"
    cand.write_text((CANDIDATES / "honest_scale.py").read_text() + (
        "\nimport os as _os\n_p = _os.path.join(_os.environ['XDG_CACHE_HOME'], 'tool', 'seen')\n"
        "_os.makedirs(_os.path.dirname(_p), exist_ok=True)\n"
        "open(_p, 'a').write('x')\n"))
    for _ in range(2):
        rec = evaluate(PROBLEMS / "scale_relu.py", cand, FAST)
        assert rec.correct and rec.error is None, rec.error
    kept = cache.compile_cache(cand.read_bytes()) / "xdg" / "tool" / "seen"
    assert kept.read_text() == "xx"


@needs_sandbox
def test_judge_process_is_out_of_reach(records):
    rec = records["escape_judge_process"]
    assert rec.correct and rec.error is None, rec.error
    assert rec.sandbox == "bwrap"


@needs_sandbox
def test_files_environment_network_and_daemons(tmp_path, monkeypatch):
    ref = tmp_path / "refs" / "scale_relu.py"
    ref.parent.mkdir()
    ref.write_text((PROBLEMS / "scale_relu.py").read_text())
    other = tmp_path / "cands" / "other.py"
    other.parent.mkdir()
    other.write_text("# another candidate\n")
    db, json_out = tmp_path / "kfuse.db", tmp_path / "out.json"
    db.write_bytes(b"SQLite format 3\x00")
    json_out.write_text("{}\n")
    home_probe = Path.home() / f".kfuse-escape-probe-{uuid.uuid4().hex[:8]}"
    targets = [str(p) for p in (ref, other, db, json_out, home_probe, tmp_path / "new-file")]
    before = {p: Path(p).read_bytes() if Path(p).exists() else None for p in targets}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    monkeypatch.setenv("KFUSE_TEST_SECRET", "hunter2")
    cand = fill("escape_files", tmp_path / "cands" / "scale_relu.py", TARGETS=targets,
                PORT=listener.getsockname()[1])
    try:
        rec = evaluate(ref, cand, FAST)
        left = daemons()
    finally:
        listener.close()
        for pid in daemons():  # only the daemons this test's candidate started (marked by their argv)
            os.kill(pid, signal.SIGKILL)
        if home_probe.exists():
            home_probe.unlink()
    assert rec.correct and rec.error is None, rec.error
    assert {p: Path(p).read_bytes() if Path(p).exists() else None for p in targets} == before
    assert left == [], "a process of the candidate outlived the judge"


@needs_sandbox
def test_kernel_enforced_limits(tmp_path):
    forks = 100 if (os.geteuid() != 0 or sandbox.pids_cgroup_possible()) else 0
    cand = fill("escape_limits", tmp_path / "scale_relu.py", MEMORY_BYTES=4 * GIB, FORKS=forks, FILE_BYTES=32 << 20)
    limits = sandbox.Limits(memory_bytes=3 * GIB, processes=64, file_bytes=16 << 20)
    rec = evaluate(PROBLEMS / "scale_relu.py", cand, EvalConfig(**{**FAST.__dict__, "limits": limits}))
    assert rec.correct and rec.error is None, rec.error


@needs_sandbox
def test_cpu_time_is_limited_by_the_kernel():
    """The judge's timeout is long; the kernel's CPU-time limit ends the spinning candidate first."""
    limits = sandbox.Limits(cpu_s=8)
    cfg = EvalConfig(**{**FAST.__dict__, "limits": limits, "timeout_s": 120})
    rec = evaluate(PROBLEMS / "scale_relu.py", CANDIDATES / "escape_cpu.py", cfg)
    assert not rec.compiled and "killed by SIGXCPU" in (rec.error or ""), rec.error
    assert rec.elapsed_s < 60


def test_reference_is_read_once_before_the_candidate_starts(tmp_path):
    """Unsandboxed (the sandbox would hide REF anyway): the rewrite lands, but on a file the judge no
    longer reads; the extra shapes still draw their own batch and the 16-row kernel fails there."""
    ref = tmp_path / "linear_relu.py"
    ref.write_text((PROBLEMS / "linear_relu.py").read_text())
    cand = fill("rewrite_reference", tmp_path / "cand.py", REF=str(ref))
    rec = evaluate(ref, cand, EvalConfig(**{**FAST.__dict__, "sandboxed": False}))
    assert "torch.randn(16, in_features)" in ref.read_text()  # the candidate did rewrite it
    assert not rec.correct and "shape_specialized" in rec.flags, (rec.flags, rec.failures)


def test_cutlass_headers_are_bound_read_only_and_named(tmp_path, monkeypatch):
    """A --backend cuda candidate builds its Hopper GEMM from $CUTLASS_PATH's headers where CUTLASS is not a pip
    package in a bound site-packages: the folder is bound read-only and the variable passed; nothing without it."""
    box = sandbox.Sandbox(io_dir=tmp_path, gpu=False, interpret=True, limits=sandbox.limits_for(60.0))
    monkeypatch.delenv("CUTLASS_PATH", raising=False)
    assert sandbox.header_dirs() == [] and "CUTLASS_PATH" not in sandbox.environment(box)
    headers = tmp_path / "cutlass"
    headers.mkdir()
    monkeypatch.setenv("CUTLASS_PATH", str(headers))
    args = sandbox.argv(box, ["true"])
    binds = [args[i + 1:i + 3] for i, a in enumerate(args) if a == "--ro-bind"]
    assert [str(headers), str(headers)] in binds and ["--bind", str(headers)] not in [args[i:i + 2] for i in
                                                                                  range(len(args))]
    assert sandbox.environment(box)["CUTLASS_PATH"] == str(headers)
