"""`--backend cuda` code generation over many problem files, on a machine without a GPU:

    PYTHONPATH=src python3 benchmarks/cuda_backend/codegen_sweep.py FOLDER... [--nvcc OUT_DIR]

For each problem file (at its file's sizes): the CUDA backend's ModelNew source, checked for completeness as
tests/test_cuda_backend.py's `check_emitted` does (it parses, imports no Triton, every bound function and launched
kernel is defined); the region kinds it fused are counted. `--nvcc DIR`: every file with a region of another kind
than the plain epilogue is also compiled with nvcc for sm_90 (without CUTLASS: the WMMA tile), its sources and logs
kept in DIR.
Prints one line per failure and a summary; exit 1 if anything failed.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

NVCC = ["nvcc", "-c", "-std=c++20", "-O3", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
        "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr", "-gencode=arch=compute_90,code=sm_90",
        "-Xptxas", "-v"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--nvcc", type=Path)
    args = ap.parse_args()
    from test_cuda_backend import check_emitted, compile_cuda

    files = sorted(f for d in args.folders for f in (d.rglob("*.py") if d.is_dir() else [d]))
    kinds: Counter = Counter()
    failed = 0
    for f in files:
        try:
            c = compile_cuda(f)
            fused = {r.kind for v in c.variants for r in v.regions if r.fused}
            if c.fallback is None and fused:
                check_emitted(c.source)
        except Exception as err:  # a sweep: report and go on
            print(f"FAIL {f}: {type(err).__name__}: {str(err)[:200]}")
            failed += 1
            continue
        kinds.update(fused)
        if args.nvcc and fused - {"gemm_epilogue"} and "CUDA_SRC" in c.source:
            args.nvcc.mkdir(parents=True, exist_ok=True)
            stem = f"{f.parent.name}_{f.stem}"
            cu = args.nvcc / f"{stem}.cu"
            cu.write_text(ast.literal_eval(re.search(r"CUDA_SRC = (r\'\'\'.*?\'\'\')", c.source, re.S).group(1)))
            r = subprocess.run([*NVCC, cu.name, "-o", os.devnull], cwd=args.nvcc, capture_output=True, text=True)
            (args.nvcc / f"{stem}.log").write_text(r.stderr)
            spills = set(re.findall(r"(\d+) bytes spill stores", r.stderr))
            ok = r.returncode == 0 and spills <= {"0"}
            print(f"nvcc {stem}: {'ok' if ok else 'FAIL'} ({', '.join(sorted(fused))})")
            failed += not ok
    print(f"{len(files)} files, {failed} failed; fused regions by kind: {dict(sorted(kinds.items()))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
