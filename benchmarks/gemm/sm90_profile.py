"""Kernel times of one problem's ModelNew forward under torch.profiler, every GEMM forced to one config
(sm90_ab.CONFIGS); also the SM clock the GPU reports while the forward repeats (power throttling shows here).

Usage (GPU): python3 benchmarks/gemm/sm90_profile.py problems/seeds/39_gemm_scale_batchnorm.py sm90_c4
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kfuse.load import load_problem  # noqa: E402
from kfuse.optimize import Options, compile_problem, load_module  # noqa: E402
from kfuse.timing import time_cuda  # noqa: E402
from kfuse.verify import seeded_build, seeded_inputs  # noqa: E402
from sm90_ab import CONFIGS, use_config  # noqa: E402


def main() -> None:
    path, *names = sys.argv[1:]
    os.environ["KFUSE_AUTOTUNE"] = "0"
    prob = load_problem(path)
    mod_path = Path(tempfile.mkdtemp()) / f"{prob.name}_new.py"
    mod_path.write_text(compile_problem(prob, Options(device="cuda")).source)
    mod = load_module(mod_path)
    for name in names:
        cfg = CONFIGS[name]
        use_config(mod, name)
        model = seeded_build(prob, 0, mod.ModelNew, device="cuda")
        inputs = seeded_inputs(prob, 0, device="cuda")
        with torch.no_grad():
            for _ in range(3):
                model(*inputs)
            torch.cuda.synchronize()
            smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader",
                                    "-lms", "100"], stdout=subprocess.PIPE, text=True)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    model(*inputs)
                torch.cuda.synchronize()
            smi.terminate()
            clocks = smi.communicate()[0].split("\n")
        print(f"== {prob.name} {name} ({cfg.short()})")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60))
        print("nvidia-smi during the profiled calls:", [c for c in clocks if c][:12])
        with torch.no_grad():
            bench = time_cuda(lambda: model(*inputs)).median_ms  # the bench's method: L2 flushed before each call
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(20):
                model(*inputs)
            end.record()
            end.synchronize()
            back_to_back = start.elapsed_time(end) / 20
            torch.cuda.synchronize()
            import time
            t0 = time.perf_counter()
            for _ in range(20):
                model(*inputs)
            host = (time.perf_counter() - t0) / 20 * 1e3
            torch.cuda.synchronize()
        print(f"time_cuda median {bench:.4f} ms, back-to-back {back_to_back:.4f} ms/call, "
              f"host issue {host:.4f} ms/call")
        if os.environ.get("GAPS"):  # the bench's loop (an L2 flush before each call) under the profiler: GPU idle
            flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")  # time between the kernels
            with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof2:
                for _ in range(10):
                    flush.zero_()
                    model(*inputs)
                torch.cuda.synchronize()
            kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof2.events()
                             if e.device_type == torch.autograd.DeviceType.CUDA)
            gaps = [(b[0] - a[1], b[2][:40]) for a, b in zip(kernels, kernels[1:])]
            print("GPU idle before each kernel (us), last 2 calls:", [(round(g, 1), n) for g, n in gaps[-12:]])
        if os.environ.get("HOST_PROFILE"):  # where the host's time per call goes (cProfile, 20 calls)
            import cProfile
            import pstats
            with torch.no_grad():
                prof_host = cProfile.Profile()
                prof_host.enable()
                for _ in range(20):
                    model(*inputs)
                prof_host.disable()
                torch.cuda.synchronize()
            pstats.Stats(prof_host).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
