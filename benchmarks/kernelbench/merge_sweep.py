"""Merge `kfuse optimize --json` sweep rows (one file of many rows, or one file per problem) into one table.

    python benchmarks/kernelbench/merge_sweep.py OUT.json OUT.md ROWS.json [levelN=REPORT.json ...] \
        [--timeouts NAMES.txt]

A later file's row replaces an earlier one of the same problem (a problem run again after a fix). --timeouts lists
`name rc seconds` lines (the per-problem runner's results.txt): a problem with rc 124 and no row becomes a row with
`exit: 124` and `error: timed out`. The Markdown table counts, per level, the problems fully fused, partly fused and
all torch calls, and the ops left as torch calls most often.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path


def level(path: str) -> str:
    return next((p for p in Path(path).parts if p.startswith("level")), "?")


def kind(row: dict) -> str:
    fused = [r for r in row.get("regions", []) if r["kind"] not in ("torch", "view")]
    if row.get("exit") != 0:
        return "failed"
    return "fully fused" if fused and not row.get("unfused_ops") else "partly fused" if fused else "all torch calls"


def main(argv: list[str]) -> None:
    out_json, out_md, *rest = argv
    timeouts = None
    if "--timeouts" in rest:
        i = rest.index("--timeouts")
        timeouts, rest = rest[i + 1], rest[:i] + rest[i + 2:]
    rows: dict[str, dict] = {}
    for arg in rest:
        lv, _, f = arg.rpartition("=")  # "level3=FILE": a single problem's report, which names no path
        data = json.loads(Path(f).read_text())
        for row in data if isinstance(data, list) else [data]:
            path = row.get("path") or f"{lv}/{row.get('problem', Path(f).stem)}.py"
            exit_ = row.get("exit", 0 if row.get("output") else 1)
            rows[Path(path).stem] = {**row, "path": path, "exit": exit_}
    if timeouts:
        for line in Path(timeouts).read_text().splitlines():
            name, rc, secs = line.split()
            if rc == "124" and name not in rows:
                rows[name] = {"problem": name, "path": f"level3/{name}.py", "exit": 124, "correct": False,
                              "error": f"timed out after {secs} s (per-problem limit)", "regions": [],
                              "unfused_ops": []}
    ordered = sorted(rows.values(), key=lambda r: (level(r["path"]), int(Path(r["path"]).stem.split("_")[0])))
    Path(out_json).write_text(json.dumps(ordered, indent=1) + "\n")
    counts = collections.Counter((level(r["path"]), kind(r)) for r in ordered)
    ops = collections.Counter(u.split(" ")[0] for r in ordered for u in r.get("unfused_ops", []))
    lines = ["| level | problems | exit 0 | fully fused | partly fused | all torch calls | failed |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for lv in sorted({level(r["path"]) for r in ordered}):
        n = sum(1 for r in ordered if level(r["path"]) == lv)
        ok = sum(1 for r in ordered if level(r["path"]) == lv and r.get("exit") == 0)
        lines.append(f"| {lv} | {n} | {ok} | " + " | ".join(str(counts[(lv, k)]) for k in
                     ("fully fused", "partly fused", "all torch calls", "failed")) + " |")
    lines += ["", "Ops left as torch calls most often: " + ", ".join(f"{o} ({c})" for o, c in ops.most_common(15)), "",
              "| problem | exit | correct | fused regions | fallback / error | seconds |",
              "| --- | ---: | --- | ---: | --- | ---: |"]
    for r in ordered:
        fused = sum(1 for x in r.get("regions", []) if x["kind"] not in ("torch", "view"))
        why = r.get("error") or r.get("fallback") or ""
        lines.append(f"| {level(r['path'])}/{Path(r['path']).stem} | {r.get('exit')} "
                     f"| {'yes' if r.get('correct') else 'no'} | {fused} | {why[:90].replace('|', '/')} "
                     f"| {r.get('seconds', '')} |")
    Path(out_md).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
