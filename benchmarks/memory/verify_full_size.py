"""Does the accuracy contract's verification fit the GPU at KernelBench's full sizes? (issue 18, item 3)

For every problem under ../shared/kernelbench/level{1,2,3} (or those given), in a fresh process each: the
contract (kfuse.verify.check_contract) with eager itself as the candidate, `--trials` draws, no extra shape.
One JSON line per problem: `status` ok (verified; `correct` may still be false where eager itself is not
allclose to float64: then rule 2's reference is float64 and eager, as a candidate, fails it), too_big (the
one-line KfuseError: the eager model does not fit), oom (the bug this checks for), error, or timeout; how the
float64 evaluation ran (`float64`: whole / N slices / cpu, per draw), seconds, the GPU's peak reserved memory.

    python benchmarks/memory/verify_full_size.py --json benchmarks/memory/h100-verify.jsonl
    python benchmarks/memory/verify_full_size.py ../shared/kernelbench/level1/19_ReLU.py   # one problem
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELBENCH = ROOT.parent / "shared" / "kernelbench"


def one(path: str, trials: int, device: str) -> dict:
    """The check of one problem, in this process."""
    import torch

    from kfuse import verify
    from kfuse.errors import KfuseError
    from kfuse.load import load_problem

    ways: list[str] = []
    real_run = verify.reference_run

    def reference_run(*args, **kwargs):
        ref, pristine = real_run(*args, **kwargs)
        ways.append(ref.float64_run)
        return ref, pristine

    verify.reference_run = reference_run  # check_contract looks it up here at each draw
    start = time.monotonic()
    row: dict = {"problem": path}
    try:
        prob = load_problem(path)
        rep = verify.check_contract(prob, verify.run_in_process(prob.model_cls), device=device, trials=trials,
                                    extra_shape=False)
        row.update(status="ok", correct=rep.correct, allclose_reference=rep.allclose_reference,
                   kernelbench_allclose=rep.kernelbench_allclose, ref_max_abs_err=rep.ref_max_abs_err,
                   failures=rep.failures[:3])
    except KfuseError as err:
        row.update(status="too_big" if "needs" in str(err) or "ran out" in str(err) else "error", error=str(err))
    except torch.cuda.OutOfMemoryError as err:
        row.update(status="oom", error=str(err).splitlines()[0])
    except Exception as err:  # noqa: BLE001 - recorded, the sweep goes on
        row.update(status="error", error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    row.update(float64=ways, seconds=round(time.monotonic() - start, 1),
               peak_reserved_gb=round(torch.cuda.max_memory_reserved() / 1e9, 1) if device == "cuda" else None)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="*", help="problem files (default: every KernelBench level 1-3 file)")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to try the script")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per problem")
    ap.add_argument("--json", type=Path, help="append one JSON line per problem here")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.trials, args.device)))
        return
    paths = [Path(p) for p in args.problems] or sorted(
        (p for lvl in (1, 2, 3) for p in (KERNELBENCH / f"level{lvl}").glob("*.py")),
        key=lambda p: (p.parent.name, int(p.name.split("_")[0])))
    for path in paths:
        try:
            proc = subprocess.run([sys.executable, __file__, "--one", str(path), "--trials", str(args.trials),
                                   "--device", args.device],
                                  capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else {
                "problem": str(path), "status": "error", "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
        except subprocess.TimeoutExpired:
            row = {"problem": str(path), "status": "timeout", "seconds": args.timeout}
        print(json.dumps(row), flush=True)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
