"""Write the GPU ModelNew (scheme fp16x3p) of each problem with the kfuse on PYTHONPATH, without a GPU.

    PYTHONPATH=<tree>/src python benchmarks/codegen/make_files.py OUT_DIR PROBLEM.py ...

compile_problem captures on the meta device, so full-size problems cost nothing here; the files are what
`kfuse optimize --device cuda` would verify and write (the header's verification summary aside).
"""

from __future__ import annotations

import sys
from pathlib import Path

from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem


def main(out: str, problems: list[str]) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    for path in problems:
        problem = load_problem(path)
        compiled = compile_problem(problem, Options(device="cuda"))
        if compiled.fallback:
            raise SystemExit(f"{path}: {compiled.fallback}")
        target = Path(out) / f"{problem.name}.py"
        target.write_text(compiled.source)
        print(target, len(compiled.source.splitlines()), "lines")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
