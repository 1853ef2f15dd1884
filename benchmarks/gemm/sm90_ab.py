"""A/B on the GPU: each problem's ModelNew (kfuse's generated file) with every GEMM forced to one config, the
Triton tile or the Gluon twin (kernels/gemm_sm90.py) at several promotion chunks; each checked against the
accuracy contract (kfuse.verify.check_contract: `--trials` draws + the extra shape) and timed like the bench
(kfuse.timing.time_cuda: L2 flushed, median of 30), in one process.

Usage (GPU): PYTHONUNBUFFERED=1 python3 benchmarks/gemm/sm90_ab.py problems/seeds/*.py --json $OUT/ab.json
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from kfuse.kernels.gemm_core import GemmConfig  # noqa: E402
from kfuse.kernels.runtime import TAIL_SLICES  # noqa: E402
from kfuse.load import load_problem  # noqa: E402
from kfuse.optimize import Options, compile_problem, load_module  # noqa: E402
from kfuse.timing import time_cuda  # noqa: E402
from kfuse.verify import check_contract, run_in_process, seeded_build, seeded_inputs  # noqa: E402

TRITON = GemmConfig(128, 128, 64, 8, 8, 3, split_a=False)
CONFIGS = {"triton": TRITON, **{f"sm90_c{c}": GemmConfig(128, 128, 64, 8, 8, 3, split_a=False, sm90=True, chunk=c)
                                for c in (1, 2, 4, 8, 16, 32)},
           "sm90p_c4": GemmConfig(128, 128, 64, 8, 8, 3, split_a=False, persistent=True, sm90=True, chunk=4),
           # the persistent twin without its tail split (the early promotion wait, A/B'd as "sm90_c4e" and
           # "sm90p_c4e" at ddaa120, is now the only one)
           "sm90p_c4_notail": GemmConfig(128, 128, 64, 8, 8, 3, split_a=False, persistent=True, sm90=True, chunk=4),
           # two blocks per SM, one consumer warpgroup each (64 x 128 tiles, 2 stages)
           **{f"sm90_64_c{c}": GemmConfig(64, 128, 64, 8, 4, 2, split_a=False, sm90=True, chunk=c) for c in (2, 4, 8)}}


def use_config(mod, name: str) -> None:
    """Force every GEMM of the generated module `mod` onto CONFIGS[name]; "_notail" names also turn off the
    persistent twin's tail split (runtime.sm90_tail, through the module's TAIL_SLICES)."""
    mod.TUNER.force(CONFIGS[name])
    mod.TAIL_SLICES = 1 if name.endswith("_notail") else TAIL_SLICES


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problems", nargs="+")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds, configs alternating")
    ap.add_argument("--json", default="sm90_ab.json")
    args = ap.parse_args()
    os.environ["KFUSE_AUTOTUNE"] = "0"  # every GEMM runs the config forced below (TUNER.force)
    names = args.configs.split(",")
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "command": " ".join(sys.argv), "results": []}
    tmp = Path(tempfile.mkdtemp())
    for path in args.problems:
        prob = load_problem(path)
        mod_path = tmp / f"{prob.name}_new.py"
        mod_path.write_text(compile_problem(prob, Options(device="cuda")).source)
        mod = load_module(mod_path)
        models = {}
        row = {"problem": prob.name, "configs": {}}
        for name in names:
            use_config(mod, name)
            t0 = time.time()
            rep = check_contract(prob, run_in_process(mod.ModelNew), device="cuda", trials=args.trials)
            row["configs"][name] = {"correct": rep.correct, "rules": rep.rules, "max_abs_err": rep.max_abs_err,
                                    "ref_max_abs_err": rep.ref_max_abs_err, "check_s": round(time.time() - t0, 1),
                                    "failures": rep.failures[:6],
                                    "ms": []}
            models[name] = (seeded_build(prob, 0, mod.ModelNew, device="cuda"), seeded_inputs(prob, 0, device="cuda"))
            print(json.dumps({"problem": prob.name, "config": name, **row["configs"][name]}), flush=True)
        for _ in range(args.rounds):
            for name in names:
                use_config(mod, name)
                model, inputs = models[name]
                with torch.no_grad():
                    t = time_cuda(lambda: model(*inputs))
                row["configs"][name]["ms"].append(round(t.median_ms, 4))
        print(json.dumps({"problem": prob.name, "ms": {n: row["configs"][n]["ms"] for n in names}}), flush=True)
        out["results"].append(row)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
