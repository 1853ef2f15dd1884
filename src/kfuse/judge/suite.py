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
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from kfuse.errors import KfuseError
from kfuse.judge.evaluate import EvalConfig, EvalRecord, evaluate
from kfuse.judge.launch import Launched, close_launched, prestart

FAST_P = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0)
PROBLEM_SEED_STRIDE = 100_003

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started TEXT NOT NULL,
    ref_dir TEXT, cand_dir TEXT, device TEXT, precision TEXT,
    gpu TEXT, torch TEXT, triton TEXT, python TEXT, git_commit TEXT,
    seed INTEGER, trials INTEGER, perf_trials INTEGER,
    n_problems INTEGER, fast_p TEXT, config TEXT, finished INTEGER DEFAULT 0
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


def judge_pair(ref: Path, cand: Path | None, cand_dir: Path, cfg: EvalConfig, seed: int,
               prestarted: Future[Launched] | None = None) -> EvalRecord:
    """One row of a suite, whatever happens: a missing candidate, a bad REF or a judge failure on a hostile
    answer is that row's error, never the end of the suite."""
    if cand is None:
        return missing_record(ref, cand_dir, cfg, seed)
    try:
        return evaluate(ref, cand, dataclasses.replace(cfg, seed=seed), prestarted)
    except KfuseError as err:
        text = f"reference: {err}"
    except Exception as err:  # noqa: BLE001 - the judge's own failure on this pair; the others go on
        text = f"judge failed on this candidate: {type(err).__name__}: {str(err)[:300]}"
    return EvalRecord(problem=ref.stem, ref=str(ref), candidate=str(cand), device=cfg.device,
                      precision=cfg.precision, seed=seed, error=text)


class Prestarts:
    """Workers started ahead: when the suite's n-th candidate starts, the worker of the (n + ahead)-th is
    launched (launch.prestart: sandbox, `import torch`, CUDA and CUPTI warmed, no candidate code), so its
    start overlaps the judging of the candidates before it instead of adding to its own."""

    def __init__(self, cands: Sequence[Path], cfg: EvalConfig, ahead: int) -> None:
        self.cands, self.cfg, self.ahead = list(cands), cfg, ahead
        self.pool = ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="kfuse-prestart")
        self.futures: dict[int, Future[Launched]] = {}
        self.claimed: set[int] = set()  # candidates that started, or whose worker was launched: never twice
        self.lock = threading.Lock()

    def take(self, n: int) -> Future[Launched] | None:
        """Candidate n's prestarted worker, if any (the first `ahead` start their own), launching n + ahead's."""
        with self.lock:
            self.claimed.add(n)
            later = n + self.ahead
            if later < len(self.cands) and later not in self.claimed:
                self.claimed.add(later)
                self.futures[later] = self.pool.submit(prestart, self.cands[later], self.cfg)
            return self.futures.pop(n, None)

    def close(self) -> None:
        """Workers started for candidates never judged (the suite was interrupted) are ended."""
        with self.lock:
            left, self.futures = list(self.futures.values()), {}
        for future in left:
            if not future.cancel():
                close_launched(future)
        self.pool.shutdown(wait=True)


def run_suite(ref_dir: Path, cand_dir: Path, cfg: EvalConfig, db_path: Path,
              on_record: Callable[[EvalRecord], None] | None = None, jobs: int = 1,
              ray_address: str | None = None) -> SuiteResult:
    """Judge every pair; each record is committed to the database as soon as it is judged, and the run's
    fast_p when all are. `jobs` pairs run side by side in this process (their imports, compilation and
    correctness checks overlap; timings never do: clock.GATE); with `ray_address`, every pair is a Ray
    task instead (distributed.py). The records are the same either way."""
    pairs = pair_files(ref_dir, cand_dir)
    base = cfg.seed if cfg.seed is not None else secrets.randbelow(2**30)
    env = environment(cfg.device)
    run_id = start_run(db_path, ref_dir, cand_dir, cfg, base, env, len(pairs))
    records: dict[int, EvalRecord] = {}
    lock = threading.Lock()

    def done(i: int, record: EvalRecord) -> None:
        with lock:
            save_record(db_path, run_id, record)
            records[i] = record
            if on_record:
                on_record(record)

    seeds = [base + i * PROBLEM_SEED_STRIDE for i in range(len(pairs))]
    for i, (ref, cand) in enumerate(pairs):
        if cand is None:
            done(i, missing_record(ref, cand_dir, cfg, seeds[i]))
    present = [(i, ref, cand, seeds[i]) for i, (ref, cand) in enumerate(pairs) if cand is not None]
    if ray_address:
        from kfuse.judge.distributed import run_pairs

        run_pairs(present, cand_dir, cfg, ray_address, done)
    else:
        prestarts = Prestarts([cand for _, _, cand, _ in present], cfg, ahead=max(jobs, 1))
        try:
            if jobs <= 1:
                for n, (i, ref, cand, seed) in enumerate(present):
                    done(i, judge_pair(ref, cand, cand_dir, cfg, seed, prestarts.take(n)))
            else:
                with ThreadPoolExecutor(max_workers=jobs) as pool:  # the work is in worker processes; threads wait
                    def judge(n: int) -> EvalRecord:
                        _, ref, cand, seed = present[n]
                        return judge_pair(ref, cand, cand_dir, cfg, seed, prestarts.take(n))

                    futures = {pool.submit(judge, n): i for n, (i, _, _, _) in enumerate(present)}
                    for future in as_completed(futures):
                        done(futures[future], future.result())
        finally:
            prestarts.close()
    ordered = [records[i] for i in sorted(records)]
    fp = fast_p(ordered)
    finish_run(db_path, run_id, fp)
    return SuiteResult(run_id, ordered, fp, env)


def connect(db_path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(db_path, timeout=60)
    con.executescript(SCHEMA)
    columns = {r[1] for r in con.execute("PRAGMA table_info(runs)")}
    if "finished" not in columns:  # databases written before runs recorded their completion
        con.execute("ALTER TABLE runs ADD COLUMN finished INTEGER DEFAULT 1")
    con.row_factory = sqlite3.Row
    return con


def start_run(db_path: Path, ref_dir: Path, cand_dir: Path, cfg: EvalConfig, seed: int, env: dict[str, Any],
              n_problems: int) -> int:
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "seed"}
    with connect(db_path) as con:
        cur = con.execute(
            "INSERT INTO runs (started, ref_dir, cand_dir, device, precision, gpu, torch, triton, python, git_commit,"
            " seed, trials, perf_trials, n_problems, fast_p, config, finished)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0)",
            (datetime.now(timezone.utc).isoformat(timespec="seconds"), str(ref_dir), str(cand_dir), cfg.device,
             cfg.precision, env["gpu"], env["torch"], env["triton"], env["python"], env["git_commit"], seed,
             cfg.trials, cfg.perf_trials, n_problems, None, json.dumps(config, default=str)))
        return int(cur.lastrowid)


def save_record(db_path: Path, run_id: int, r: EvalRecord) -> None:
    """One record, committed at once: a later crash (of a candidate or of the judge) cannot lose it."""
    j = r.to_json()
    with connect(db_path) as con:
        con.execute(
            "INSERT INTO records VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, r.problem, r.candidate, int(r.compiled), int(r.correct), json.dumps(r.flags),
             _real(j["max_abs_err"]), r.runtime_ms, r.ref_runtime_ms, r.speedup_eager, r.speedup_compile,
             r.error, json.dumps(j)))


def finish_run(db_path: Path, run_id: int, fp: dict[str, float | None]) -> None:
    with connect(db_path) as con:
        con.execute("UPDATE runs SET fast_p = ?, finished = 1 WHERE id = ?", (json.dumps(fp), run_id))


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
    return _run_meta(row, records), records


def _run_meta(row: sqlite3.Row, records: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A run's row; an unfinished run's fast_p is computed over the records stored so far."""
    meta = dict(row)
    meta["fast_p"] = json.loads(meta["fast_p"]) if meta["fast_p"] else fast_p(records or [])
    return meta


def list_runs(db_path: Path, limit: int = 10) -> list[dict[str, Any]]:
    with connect(db_path) as con:
        rows = con.execute("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [_run_meta(r, [json.loads(x["record"]) for x in
                              con.execute("SELECT record FROM records WHERE run_id = ?", (r["id"],))]) for r in rows]
