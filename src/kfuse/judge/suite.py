"""`kfuse eval-suite`: every (REF, CANDIDATE) pair of two folders, matched by file name, -> fast_p -> SQLite.

fast_p (KernelBench): the fraction of *all* problems whose candidate is correct and faster than p x eager
(speedup_eager > p). fast_0 is the fraction correct. Without timing (CPU) fast_p for p > 0 is None.
Each run is stored with what makes it reproducible and comparable: GPU name, torch/triton/python
versions, the base seed, the git commit of kfuse, and the config.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import secrets
import sqlite3
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from kfuse.errors import KfuseError
from kfuse.judge.evaluate import EvalConfig, EvalRecord, evaluate

FAST_P = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0)
PROBLEM_SEED_STRIDE = 100_003

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started TEXT NOT NULL,
    ref_dir TEXT, cand_dir TEXT, device TEXT, precision TEXT,
    gpu TEXT, torch TEXT, triton TEXT, python TEXT, git_commit TEXT,
    seed INTEGER, trials INTEGER, perf_trials INTEGER,
    n_problems INTEGER, fast_p TEXT, config TEXT
);
CREATE TABLE IF NOT EXISTS records (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    problem TEXT NOT NULL, candidate TEXT,
    compiled INTEGER, correct INTEGER, flags TEXT,
    max_abs_err REAL, runtime_ms REAL, ref_runtime_ms REAL, speedup_eager REAL, speedup_compile REAL,
    error TEXT, record TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class SuiteResult:
    run_id: int
    records: list[EvalRecord]
    fast_p: dict[str, float | None]
    environment: dict[str, Any]


def pair_files(ref_dir: Path, cand_dir: Path) -> list[tuple[Path, Path | None]]:
    """Each REF_DIR/*.py with CAND_DIR/<same name> (None where the candidate is missing)."""
    for d, what in ((ref_dir, "REF_DIR"), (cand_dir, "CANDIDATE_DIR")):
        if not d.is_dir():
            raise KfuseError(f"{d}: {what} is not a directory")
    refs = sorted(p for p in ref_dir.glob("*.py") if not p.name.startswith("_"))
    if not refs:
        raise KfuseError(f"{ref_dir}: no problem files (*.py)")
    return [(r, cand_dir / r.name if (cand_dir / r.name).is_file() else None) for r in refs]


def fast_p(records: Sequence[EvalRecord | dict[str, Any]], ps: Sequence[float] = FAST_P) -> dict[str, float | None]:
    rows = [r if isinstance(r, dict) else dataclasses.asdict(r) for r in records]
    if not rows:
        return {f"fast_{p:g}": None for p in ps}
    correct = [r for r in rows if r["correct"]]
    timed = all(r.get("speedup_eager") is not None for r in correct)
    out: dict[str, float | None] = {}
    for p in ps:
        if p == 0:
            out["fast_0"] = len(correct) / len(rows)
        elif not timed:
            out[f"fast_{p:g}"] = None  # some correct candidate has no timing (CPU): unknown, not zero
        else:
            out[f"fast_{p:g}"] = sum(r["speedup_eager"] > p for r in correct) / len(rows)
    return out


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(device: str) -> dict[str, Any]:
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = None
    gpu = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton_version,
            "python": platform.python_version(), "git_commit": git_commit()}


def missing_record(ref: Path, cand_dir: Path, cfg: EvalConfig, seed: int) -> EvalRecord:
    return EvalRecord(problem=ref.stem, ref=str(ref), candidate=str(cand_dir / ref.name), device=cfg.device,
                      precision=cfg.precision, seed=seed, error=f"no candidate {ref.name} in {cand_dir}")


def run_suite(ref_dir: Path, cand_dir: Path, cfg: EvalConfig, db_path: Path,
              on_record: Callable[[EvalRecord], None] | None = None) -> SuiteResult:
    """Evaluate every pair one after another (one GPU: timings must not overlap), then store the run."""
    pairs = pair_files(ref_dir, cand_dir)
    base = cfg.seed if cfg.seed is not None else secrets.randbelow(2**30)
    records = []
    for i, (ref, cand) in enumerate(pairs):
        seed = base + i * PROBLEM_SEED_STRIDE
        if cand is None:
            record = missing_record(ref, cand_dir, cfg, seed)
        else:
            try:
                record = evaluate(ref, cand, dataclasses.replace(cfg, seed=seed))
            except KfuseError as err:  # a bad REF in a suite is one failed row, not the end of the suite
                record = EvalRecord(problem=ref.stem, ref=str(ref), candidate=str(cand), device=cfg.device,
                                    precision=cfg.precision, seed=seed, error=f"reference: {err}")
        records.append(record)
        if on_record:
            on_record(record)
    fp = fast_p(records)
    env = environment(cfg.device)
    run_id = save_run(db_path, ref_dir, cand_dir, cfg, base, env, fp, records)
    return SuiteResult(run_id, records, fp, env)


def connect(db_path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(db_path)
    con.executescript(SCHEMA)
    con.row_factory = sqlite3.Row
    return con


def save_run(db_path: Path, ref_dir: Path, cand_dir: Path, cfg: EvalConfig, seed: int, env: dict[str, Any],
             fp: dict[str, float | None], records: Sequence[EvalRecord]) -> int:
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "seed"}
    with connect(db_path) as con:
        cur = con.execute(
            "INSERT INTO runs (started, ref_dir, cand_dir, device, precision, gpu, torch, triton, python, git_commit,"
            " seed, trials, perf_trials, n_problems, fast_p, config) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (datetime.now(timezone.utc).isoformat(timespec="seconds"), str(ref_dir), str(cand_dir), cfg.device,
             cfg.precision, env["gpu"], env["torch"], env["triton"], env["python"], env["git_commit"], seed,
             cfg.trials, cfg.perf_trials, len(records), json.dumps(fp), json.dumps(config, default=str)))
        run_id = int(cur.lastrowid)
        for r in records:
            j = r.to_json()
            con.execute(
                "INSERT INTO records VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, r.problem, r.candidate, int(r.compiled), int(r.correct), json.dumps(r.flags),
                 _real(j["max_abs_err"]), r.runtime_ms, r.ref_runtime_ms, r.speedup_eager, r.speedup_compile,
                 r.error, json.dumps(j)))
    return run_id


def _real(v: Any) -> float | None:
    return float("inf") if v == "inf" else v


def load_run(db_path: Path, run_id: int | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the run's row, its records as the JSON dicts), latest run by default."""
    if not Path(db_path).is_file():
        raise KfuseError(f"{db_path}: no such database (run `kfuse eval-suite` first)")
    with connect(db_path) as con:
        if run_id is None:
            row = con.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        else:
            row = con.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KfuseError(f"{db_path}: no run {run_id}" if run_id is not None else f"{db_path}: no runs yet")
        records = [json.loads(r["record"]) for r in
                   con.execute("SELECT record FROM records WHERE run_id = ? ORDER BY problem", (row["id"],))]
    meta = dict(row)
    meta["fast_p"] = json.loads(meta["fast_p"])
    return meta, records


def list_runs(db_path: Path, limit: int = 10) -> list[dict[str, Any]]:
    with connect(db_path) as con:
        rows = con.execute("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
    return [{**dict(r), "fast_p": json.loads(r["fast_p"])} for r in rows]
