"""Problem 37 (1 x 8192 -> 8192, a launch- and bandwidth-bound GEMM) tuned twice in one process: by the tuner as it
is (candidates in turn, call by call) and by the sequential one it replaced (each candidate's 10 calls
one after the other); each choice's forward then timed like the bench (time_cuda), the two alternating.

Usage (GPU): python3 benchmarks/skinny/tuner_ab.py [PROBLEM]
"""
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from kfuse.load import load_problem  # noqa: E402
from kfuse.optimize import Options, compile_problem, load_module  # noqa: E402
from kfuse.timing import time_cuda  # noqa: E402
from kfuse.verify import seeded_build, seeded_inputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def sequential(launch, candidates, reps):
    """The tuner's former timing: each candidate's reps back to back."""
    timings, failed = {}, []
    for c in candidates:
        try:
            launch(c)
            torch.cuda.synchronize()
            times = []
            for _ in range(reps):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                launch(c)
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e))
            timings[c] = sorted(times)[len(times) // 2]
        except Exception as err:  # noqa: BLE001
            failed.append(str(err))
    return timings, failed


def main() -> None:
    os.environ["KFUSE_AUTOTUNE"] = "force"  # no disk cache (read when the generated module loads)
    path = sys.argv[1] if len(sys.argv) > 1 else ROOT / "problems/gemm/37_gemm_softplus_hardswish_batch1.py"
    prob = load_problem(path)
    mod_path = Path(tempfile.mkdtemp()) / f"{prob.name}_new.py"
    mod_path.write_text(compile_problem(prob, Options(device="cuda")).source)
    mod = load_module(mod_path)
    model = seeded_build(prob, 0, mod.ModelNew, device="cuda")
    inputs = seeded_inputs(prob, 0, device="cuda")
    interleaved = mod._time_launches
    chosen = {}
    for name, timer in [("interleaved", interleaved), ("sequential", sequential), ("interleaved2", interleaved)]:
        mod._time_launches = timer
        mod.TUNER.forget()
        if hasattr(mod, "forget_graphs"):
            mod.forget_graphs(model)
        n = len(mod.TUNER.log)
        with torch.no_grad():
            model(*inputs)
        for e in mod.TUNER.log[n:]:
            print(name, e["config"], e["timings_ms"])
        chosen[name] = dict(mod.TUNER.tuned)
    eager = seeded_build(prob, 0, prob.model_cls, device="cuda")
    for _ in range(3):
        for name, tuned in chosen.items():
            mod.TUNER.forget()
            mod.TUNER.tuned.update(tuned)
            if hasattr(mod, "forget_graphs"):  # a CUDA graph captured under the other choice would replay it
                mod.forget_graphs(model)
            with torch.no_grad():
                print(name, "forward", round(time_cuda(lambda: model(*inputs)).median_ms, 4), "ms")
        with torch.no_grad():
            print("eager forward", round(time_cuda(lambda: eager(*inputs)).median_ms, 4), "ms")


if __name__ == "__main__":
    main()
