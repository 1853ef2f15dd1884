"""`eval-suite --ray ADDRESS`: the same judging as Ray tasks, one per (REF, CANDIDATE) pair.

Each task gets the two files' bytes (not paths: a node need not share the driver's filesystem), writes
them to a private folder on its node and runs `evaluate` there, sandbox included. On the GPU a task asks
for one whole GPU (`num_gpus=1`: Ray sets CUDA_VISIBLE_DEVICES, so two tasks never share a card and
never time each other); on the CPU for one core. `max_retries=0`: a candidate that kills its node is a
failed record, not re-run. The driver stores each record in its SQLite database as the task finishes, so
records are the same as a local run's (same seeds, same paths shown) and none is lost to a later failure.
Scaling to many nodes: docs/eval.md, "Many GPUs with Ray".
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from kfuse.errors import KfuseError
from kfuse.judge.evaluate import EvalConfig, EvalRecord

Pair = tuple[int, Path, Path | None, int]  # index, REF, CANDIDATE (None: missing), seed


def judge_bytes(name: str, ref: bytes, cand: bytes, cfg: EvalConfig, seed: int) -> EvalRecord:
    """The task body: `evaluate` on copies of the two files in a private folder of this node."""
    from kfuse.judge.suite import judge_pair  # the worker process imports kfuse itself

    with tempfile.TemporaryDirectory(prefix="kfuse-ray-") as folder:
        (Path(folder) / "ref").mkdir()
        (Path(folder) / "cand").mkdir()
        ref_path, cand_path = Path(folder) / "ref" / name, Path(folder) / "cand" / name
        ref_path.write_bytes(ref)
        cand_path.write_bytes(cand)
        return judge_pair(ref_path, cand_path, cand_path.parent, cfg, seed)


def connect(address: str) -> None:
    """`local` starts a Ray instance on this machine; anything else (`auto`, host:port, ray://...) joins."""
    try:
        import ray
    except ImportError:
        raise KfuseError("--ray needs the ray package: pip install 'kfuse[ray]'") from None
    if not ray.is_initialized():
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except Exception as err:  # noqa: BLE001 - any connection failure is one line for the user
            raise KfuseError(f"--ray {address}: cannot connect ({type(err).__name__}: {str(err).splitlines()[0]})") \
                from None


def run_pairs(pairs: Sequence[Pair], cand_dir: Path, cfg: EvalConfig, address: str,
              on_record: Callable[[int, EvalRecord], None]) -> None:
    """Judge every present pair as a Ray task; `on_record(index, record)` as each one finishes."""
    connect(address)
    import ray

    gpus = 1 if cfg.device == "cuda" else 0
    task = ray.remote(num_gpus=gpus, num_cpus=1, max_retries=0)(judge_bytes)
    pending = {}
    for i, ref, cand, seed in pairs:
        ref_id = task.remote(ref.name, ref.read_bytes(), cand.read_bytes(), replace(cfg, seed=seed), seed)
        pending[ref_id] = (i, ref, cand, seed)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref_id in done:
            i, ref, cand, seed = pending.pop(ref_id)
            try:
                record = ray.get(ref_id)
            except Exception as err:  # noqa: BLE001 - a lost task (node died, OOM) is that pair's error
                record = EvalRecord(problem=ref.stem, ref=str(ref), candidate=str(cand), device=cfg.device,
                                    precision=cfg.precision, seed=seed,
                                    error=f"ray task failed: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
            on_record(i, replace(record, ref=str(ref), candidate=str(cand)))
