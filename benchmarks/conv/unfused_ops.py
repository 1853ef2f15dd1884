"""Which ops of KernelBench's level-2 convolution problems stay torch calls under the Triton backend's partition (the
registry's kinds, at each file's own sizes, captured on the CPU): one line per file (its fused kinds, its unfused
ops), then a count per op.

    PYTHONPATH=src python3 benchmarks/conv/unfused_ops.py > benchmarks/conv/cpu-unfused-level2.txt

Reads kb/level2 (a copy of ../shared/kernelbench/level2) through benchmarks/conv/level2-conv-files.txt.
"""

from __future__ import annotations

import collections
from pathlib import Path

from kfuse.load import load_problem
from kfuse.modes import variants
from kfuse.optimize import capture_problem
from kfuse.regions import KINDS

FILES = Path("benchmarks/conv/level2-conv-files.txt")


def partition_of(path: Path) -> tuple[list[str], list[str]]:
    """(the fused regions' kinds, the ops left as torch calls) of the file's first forward."""
    v = variants(capture_problem(load_problem(path, {}), "cpu"), KINDS)[0]
    return [r.kind for r in v.regions if r.fused], list(v.unfused)


def main() -> None:
    count: collections.Counter[str] = collections.Counter()
    for line in FILES.read_text().split():
        path = Path("kb") / line
        kinds, unfused = partition_of(path)
        print(path.stem, kinds, unfused, flush=True)
        count.update(op.split("(")[0] for op in unfused)
    print(dict(count.most_common()))


if __name__ == "__main__":
    main()
