"""The table of benchmarks/cuda_backend/gpu_check.sh: per problem, the CUDA backend's contract (kfuse optimize
--backend cuda) and the times of eager, --backend cuda and --backend triton (kfuse bench, same GPU, one after the
other), with eager/cuda and cuda/triton.

    python3 benchmarks/cuda_backend/summarize.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def bench_rows(path: Path) -> dict[str, dict[str, Any]]:
    """problem -> its kfuse bench row, or {} where the file is missing (a step cut short)."""
    if not path.exists():
        return {}
    return {r["problem"]: r for r in json.loads(path.read_text()).get("results", [])}


def optimize_row(folder: Path, problem: str) -> dict[str, Any]:
    path = folder / f"{problem}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def ms(row: dict[str, Any], key: str) -> float | None:
    v = row.get(key)
    return v if isinstance(v, (int, float)) else None


def fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def main(out: Path) -> int:
    cuda, triton = bench_rows(out / "bench-cuda.json"), bench_rows(out / "bench-triton.json")
    problems = sorted({p.stem for p in (out / "cuda").glob("*.json")} | set(cuda) | set(triton))
    head = ("problem", "contract", "bench ok", "eager ms", "cuda ms", "triton ms", "eager/cuda", "cuda/triton",
            "cuda 1st call s", "unfused (cuda)")
    rows = []
    for p in problems:
        opt, c, t = optimize_row(out / "cuda", p), cuda.get(p, {}), triton.get(p, {})
        verdict = "-" if not opt else ("ok" if opt.get("correct") else "FAILED")
        eager = ms(c, "eager_ms") or ms(t, "eager_ms")
        rows.append((p[:40], verdict, f"{c.get('correct', '-')}/{t.get('correct', '-')}", fmt(eager),
                     fmt(ms(c, "kfuse_ms")), fmt(ms(t, "kfuse_ms")), ratio(eager, ms(c, "kfuse_ms")),
                     ratio(ms(c, "kfuse_ms"), ms(t, "kfuse_ms")), fmt(ms(c, "kfuse_first_call_s"), 1),
                     ", ".join(opt.get("unfused_ops", []))[:60]))
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    for p in problems:
        opt = optimize_row(out / "cuda", p)
        for line in opt.get("failures", [])[:3]:
            print(f"{p}: {line}")
        for key, row in (("cuda", cuda.get(p, {})), ("triton", triton.get(p, {}))):
            for what, err in (row.get("errors") or {}).items():
                print(f"{p}: bench {key}: {what}: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "out/cuda_backend")))
