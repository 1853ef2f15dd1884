"""The table of a CPU sweep made by benchmarks/kernelbench/optimize_files.sh over convolution problems:

    python3 benchmarks/conv/cpu_sweep_table.py OUT > TABLE.txt

One line per row of OUT/results.txt: the file, kfuse optimize's exit code, seconds, whether the ModelNew was
verified (the report's `correct`), whether a convolution is inside a fused region, and the fused region kinds;
then a summary line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(out: Path, line: str) -> tuple[str, bool, bool]:
    name, rc, seconds = line.split()
    report = out / f"{Path(name).name}.json"
    data = json.loads(report.read_text()) if report.exists() else {}
    fused = [r for r in data.get("regions", []) if r.get("fused")]
    conv_fused = any("conv" in op.lower() for r in fused for op in r.get("ops", []))
    kinds = ",".join(dict.fromkeys(r["kind"] for r in fused)) or "-"
    correct = bool(data.get("correct"))
    print(f"{name} {rc} {seconds} {correct} {conv_fused} {kinds}")
    return name, correct, conv_fused


def main() -> int:
    out = Path(sys.argv[1])
    rows = [row(out, ln) for ln in sorted((out / "results.txt").read_text().splitlines()) if ln.strip()]
    verified = sum(c for _, c, _ in rows)
    fused = sum(f for _, _, f in rows)
    print(f"# {len(rows)} files: {verified} verified, {fused} with the convolution inside a fused region")
    return 0


if __name__ == "__main__":
    sys.exit(main())
