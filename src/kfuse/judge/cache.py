"""The judge's disk cache: baseline timings (eager and torch.compile of the reference), so a suite times
each problem's baselines once per machine, not once per candidate; reference results (same file, shape and
seeds: a suite run again with --seed computes none); and per-file compilation caches.

Entries are JSON, keyed by a hash of everything the number depends on: the problem file's bytes, the
overrides and the shape, the GPU, torch/triton versions, the precision flags, the timing protocol's
settings. The cache lives where candidates never reach (outside their sandbox), in
$KFUSE_JUDGE_CACHE_DIR, else $KFUSE_CACHE_DIR/judge, else $XDG_CACHE_HOME/kfuse/judge, else
~/.cache/kfuse/judge.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def cache_dir() -> Path:
    if os.environ.get("KFUSE_JUDGE_CACHE_DIR"):
        return Path(os.environ["KFUSE_JUDGE_CACHE_DIR"])
    if os.environ.get("KFUSE_CACHE_DIR"):
        return Path(os.environ["KFUSE_CACHE_DIR"]) / "judge"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kfuse" / "judge"


def compile_cache(source: bytes) -> Path | None:
    """A folder for one file's compilation caches (Triton, load_inline, Inductor), named by the file's
    hash: judging the same file again skips its compilation, and no other file ever shares it (a candidate
    can only ever poison its own cache)."""
    folder = cache_dir() / "compile" / hashlib.sha256(source).hexdigest()[:32]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder


def machine() -> dict[str, Any]:
    """What a timing depends on besides the problem: the device, the software, the numeric flags."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton_version,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "matmul_precision": torch.get_float32_matmul_precision()}


def key(**parts: Any) -> str:
    return hashlib.sha256(json.dumps({**parts, "machine": machine()}, sort_keys=True, default=str).encode()).hexdigest()


def load(k: str) -> dict[str, Any] | None:
    try:
        data = json.loads((cache_dir() / f"{k}.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def store(k: str, value: dict[str, Any]) -> None:
    """Write atomically (a rename), so parallel judges never read half an entry."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(tmp, folder / f"{k}.json")
    except OSError:
        pass  # a cache that cannot be written only costs time


# --- references: tensors and plain data only, loaded with weights_only=True ------------------------------

REFERENCE_CACHE_BYTES = 256 << 20  # larger reference sets are recomputed: disk is not free either


def code_version() -> str:
    """The reference computation's own source (verify, load, memory): a change there invalidates entries."""
    import kfuse

    root = Path(kfuse.__file__).parent
    h = hashlib.sha256()
    for name in ("verify.py", "load.py", "memory.py"):
        try:
            h.update((root / name).read_bytes())
        except OSError:
            h.update(name.encode())
    return h.hexdigest()[:16]


def pack(obj: Any) -> Any:
    """Dataclasses (Reference, Results) as tagged dicts; tensors, containers and scalars as they are."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__dataclass__": type(obj).__name__,
                **{f.name: pack(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
    if isinstance(obj, dict):
        return {k: pack(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [pack(v) for v in obj]
    return obj


def unpack(obj: Any, kinds: dict[str, type]) -> Any:
    if isinstance(obj, dict):
        fields = {k: unpack(v, kinds) for k, v in obj.items() if k != "__dataclass__"}
        return kinds[obj["__dataclass__"]](**fields) if "__dataclass__" in obj else fields
    if isinstance(obj, list):
        return [unpack(v, kinds) for v in obj]
    return obj


def load_tensors(k: str, kinds: dict[str, type]) -> Any | None:
    path = cache_dir() / f"{k}.pt"
    try:
        return unpack(torch.load(path, weights_only=True), kinds)
    except Exception:  # noqa: BLE001 - missing, stale or unreadable: recompute
        return None


def store_tensors(k: str, value: Any, nbytes: int) -> None:
    if nbytes > REFERENCE_CACHE_BYTES:
        return
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        os.close(fd)
        torch.save(pack(value), tmp)
        os.replace(tmp, folder / f"{k}.pt")
    except OSError:
        pass
