"""Merge `kfuse optimize --json` sweep rows (one file of many rows, or one file per problem) into one table.

    python benchmarks/kernelbench/merge_sweep.py OUT.json OUT.md ROWS.json [levelN=REPORT.json ...] \
        [--timeouts NAMES.txt ...] [--note TEXT ...]

A later file's row replaces an earlier one of the same problem (a problem run again after a fix). --timeouts lists
`name rc seconds` lines (the per-problem runner's results.txt, name NAME or levelN/NAME; repeatable, a later
line of a name wins): a problem with rc 124 and no row becomes a row with `exit: 124` and `error: timed out`, and a
row without `seconds` (a single problem's report) takes its line's seconds. --note puts a line above the tables
(the commands that made the rows). The Markdown table counts, per level, the problems fully fused, partly fused
and all torch calls, and the ops left as torch calls most often. A region is fused where its `fused` flag says so
(reports since 0709b3d), else where its kind is not `torch` or `view` (`no_kernel` since then: a view, no kernel).
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

NOT_FUSED = ("torch", "view", "no_kernel")


def level(path: str) -> str:
    return next((p for p in Path(path).parts if p.startswith("level")), "?")


def fused_regions(row: dict) -> list[dict]:
    return [r for r in row.get("regions", []) if r.get("fused", r["kind"] not in NOT_FUSED)]


def kind(row: dict) -> str:
    fused = fused_regions(row)
    if row.get("exit") != 0:
        return "failed"
    return "fully fused" if fused and not row.get("unfused_ops") else "partly fused" if fused else "all torch calls"


def options(rest: list[str], flag: str) -> tuple[list[str], list[str]]:
    """The values of every `flag VALUE` pair in `rest`, and `rest` without them."""
    values, left = [], []
    it = iter(rest)
    for arg in it:
        if arg == flag:
            values.append(next(it))
        else:
            left.append(arg)
    return values, left


def main(argv: list[str]) -> None:
    out_json, out_md, *rest = argv
    timeouts, rest = options(rest, "--timeouts")
    notes, rest = options(rest, "--note")
    rows: dict[str, dict] = {}
    for arg in rest:
        lv, _, f = arg.rpartition("=")  # "level3=FILE": a single problem's report, which names no path
        data = json.loads(Path(f).read_text())
        for row in data if isinstance(data, list) else [data]:
            path = row.get("path") or f"{lv}/{row.get('problem', Path(f).stem)}.py"
            exit_ = row.get("exit", 0 if row.get("output") else 1)
            rows[Path(path).stem] = {**row, "path": path, "exit": exit_}
    runs = {}  # name -> (rc, seconds, level) of its last line
    for f in timeouts:
        for line in Path(f).read_text().splitlines():
            if len(line.split()) < 3:
                continue  # the runner's "end" line
            name, rc, secs = line.split()[:3]
            lv, _, name = name.rpartition("/")  # "level1/NAME" or a level-3 runner's bare NAME
            runs[name] = (rc, secs, lv or "level3")
    for name, (rc, secs, lv) in runs.items():
        if rc == "124" and name not in rows:
            rows[name] = {"problem": name, "path": f"{lv}/{name}.py", "exit": 124, "correct": False,
                          "error": f"timed out after {secs} s (per-problem limit)", "regions": [],
                          "unfused_ops": []}
        elif name in rows and "seconds" not in rows[name] and str(rows[name]["exit"]) == rc:
            rows[name]["seconds"] = float(secs)
    ordered = sorted(rows.values(), key=lambda r: (level(r["path"]), int(Path(r["path"]).stem.split("_")[0])))
    Path(out_json).write_text(json.dumps(ordered, indent=1) + "\n")
    counts = collections.Counter((level(r["path"]), kind(r)) for r in ordered)
    ops = collections.Counter(u.split(" ")[0] for r in ordered for u in r.get("unfused_ops", []))
    lines = [line for note in notes for line in (note, "")]
    lines += ["| level | problems | exit 0 | fully fused | partly fused | all torch calls | failed |",
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
        fused = len(fused_regions(r))
        why = r.get("error") or r.get("fallback") or ""
        lines.append(f"| {level(r['path'])}/{Path(r['path']).stem} | {r.get('exit')} "
                     f"| {'yes' if r.get('correct') else 'no'} | {fused} | {why[:90].replace('|', '/')} "
                     f"| {r.get('seconds', '')} |")
    Path(out_md).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
