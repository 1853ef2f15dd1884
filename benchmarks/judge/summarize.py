"""Throughput of the last two eval-suite runs in a database (cold, then warm caches), as JSON.

Per candidate: elapsed_s (the whole evaluation), its own compilation (import + the first call, where Triton
and load_inline compile), and the rest: "beyond compilation", the figure issue 21 bounds at 15 s (median).
Usage: python3 benchmarks/judge/summarize.py SUITE.db [SANDBOX_UNAVAILABLE_REASON]
"""

import json
import statistics
import sys

from kfuse.judge.suite import list_runs, load_run


def summary(db: str, run: dict) -> dict:
    meta, records = load_run(db, run["id"])
    judged = [r for r in records if r.get("compiled") or (r.get("error") and "no candidate" not in r["error"])]
    rows = []
    for r in judged:
        phases = r.get("phases_s") or {}
        compile_s = sum(phases.get(k, 0.0) for k in ("import", "first_call", "first_call_extra"))
        rows.append({"problem": r["problem"], "correct": r["correct"], "flags": r["flags"], "elapsed_s": r["elapsed_s"],
                     "compile_s": round(compile_s, 3), "beyond_compile_s": round(r["elapsed_s"] - compile_s, 3),
                     "phases_s": phases, "speedup_eager": r.get("speedup_eager"), "sandbox": r.get("sandbox"),
                     "baseline_cached": (r.get("timing") or {}).get("eager", {}).get("cached", False)})
    beyond = [x["beyond_compile_s"] for x in rows]
    return {"run": meta["id"], "gpu": meta["gpu"], "torch": meta["torch"], "triton": meta["triton"],
            "commit": meta["git_commit"], "candidates": len(rows), "correct": sum(x["correct"] for x in rows),
            "median_beyond_compile_s": statistics.median(beyond) if beyond else None,
            "median_elapsed_s": statistics.median([x["elapsed_s"] for x in rows]) if rows else None,
            "fast_p": meta["fast_p"], "rows": rows}


def main() -> None:
    db = sys.argv[1]
    runs = list_runs(db, 2)[::-1]  # oldest first: cold, warm
    out = {"sandbox_unavailable": sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None,
           "command": "benchmarks/judge/gpu_throughput.sh {make,cold,warm} OUT "
                      "(eval-suite --jobs $SUITE_JOBS --seed 21 --perf-trials 100)",
           "runs": [summary(db, r) for r in runs]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
