"""One line of an A/B over `kfuse bench` runs of one problem, for the conv GPU scripts' bench steps:

    python3 benchmarks/conv/ab_line.py OUT PROBLEM LABEL=SETTING...

reads OUT/bench-SETTING-PROBLEM.json for each LABEL=SETTING and prints, per label, kfuse's time, its speedup over
eager and whether it met the contract (or why the file could not be read: a run that failed or timed out).
"""

from __future__ import annotations

import json
import sys


def one(out: str, problem: str, setting: str) -> str:
    try:
        with open(f"{out}/bench-{setting}-{problem}.json") as f:
            r = json.load(f)["results"][0]
        return f"{r['kfuse_ms']:.3f} ms ({r['speedup_vs_eager']:.2f}x, correct {r['correct']})"
    except (OSError, KeyError, IndexError, TypeError, ValueError) as err:
        return f"failed ({type(err).__name__})"


def main(argv: list[str]) -> int:
    out, problem, *pairs = argv
    print(f"{problem:55} " + "  ".join(f"{label} {one(out, problem, setting)}"
                                        for label, setting in (p.split("=", 1) for p in pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
