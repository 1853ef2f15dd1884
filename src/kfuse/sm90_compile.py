"""Compile the Hopper twins of a generated ModelNew for sm_90 without a GPU (tests and the CPU checks of CI).

The twins (`<name>_kernel_sm90`, regions/sm90_twin.py) only run on a Hopper GPU, but Triton can compile them on any
machine: its bundled ptxas targets sm_90a. Running the model once on the CPU records each GEMM launch (the
arguments the Triton kernel got); each launch's twin is then compiled with the arguments an sm90 config would
pass. What this proves: the epilogue's Triton code resolves its layouts in Gluon and the kernel fits (registers
without spilling, shared memory). What it cannot: that the results are right (GPU tests do that).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from types import ModuleType

import torch
import triton

from kfuse.kernels.runtime import sm90_options

SM90_LIMIT_SMEM = 232448  # bytes of shared memory one block may use on an H100 / H200


@dataclass(frozen=True)
class TwinBuild:
    """One twin compiled for sm_90: its name, shared memory, registers and spilled bytes (ptxas -v)."""

    name: str
    shared: int
    registers: int
    spill_bytes: int


def record_launches(module: ModuleType, run) -> list[tuple]:
    """(twin, args, kwargs) of every launch `run()` makes through the module's pick_kernel."""
    seen: list[tuple] = []
    pick = module.pick_kernel

    def recording(kernel, kernel_sm90, cfg):
        chosen = pick(kernel, kernel_sm90, cfg)
        return _Recorder(chosen, kernel_sm90, seen)

    module.pick_kernel = recording
    try:
        run()
    finally:
        module.pick_kernel = pick
    return seen


class _Recorder:
    """Stands in for `kernel[grid]`: records the launch's arguments with the twin they are for, then launches."""

    def __init__(self, kernel, twin, seen):
        self.kernel, self.twin, self.seen = kernel, twin, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.append((self.twin, args, kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch


FP16_OPERANDS = ("a_ptr", "a_lo_ptr", "b_ptr", "b_lo_ptr")
_DTYPES = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float64: "*fp64",
           torch.int32: "*i32", torch.int64: "*i64"}


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return _DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot type kernel argument {value!r}")


# what a persistent launch with a tail split passes (runtime.sm90_tail), for its argument types
TAIL_ARGS = {"TAIL": True, "tail_split": 8, "tail_ws": torch.empty(1), "tail_cnt": torch.zeros(1, dtype=torch.int32)}


def twin_specs(launches: list[tuple], cfg, tail: bool = False) -> list[dict]:
    """For each twin launched (record_launches), the signature and constexprs an sm90 config `cfg` gives it:
    types from the recorded arguments (plain data, so another process can compile it). `tail`: a persistent
    `cfg` whose grid leaves a last wave to split along K (which the CPU run's small sizes do not)."""
    specs: dict[str, dict] = {}
    for twin, args, kwargs in launches:
        values = dict(zip(twin.arg_names, args)) | {k: v for k, v in kwargs.items() if k in twin.arg_names}
        values |= {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "GROUP_M": cfg.group_m,
                   "SCHEME": "fp16x3p", "SPLIT_A": False, "EVEN_K": True, **sm90_options(cfg),
                   **(TAIL_ARGS if tail else {})}
        signature, constexprs = {}, {}
        for p in twin.params:
            if p.is_constexpr:
                signature[p.name] = "constexpr"
                if p.name in values:
                    constexprs[p.name] = values[p.name]
            elif p.name in FP16_OPERANDS:  # the CPU run passed fp32 x and W; an sm90 config passes fp16 parts
                signature[p.name] = "*fp16"
            elif p.name not in values:  # left at its default (None, or 1: Triton specializes both as constants)
                signature[p.name] = "constexpr"
                constexprs[p.name] = p._param.default
            else:
                signature[p.name] = _arg_type(values[p.name])
        specs.setdefault(twin.fn.__name__, {"twin": twin.fn.__name__, "signature": signature,
                                            "constexprs": constexprs, "num_warps": cfg.num_warps,
                                            "maxnreg": values["maxnreg"]})
    return list(specs.values())


def compile_twins(module_path: str, specs: list[dict]) -> list[TwinBuild]:
    """Compile the twins of the generated file `module_path` for sm_90 in a fresh process: Triton's interpreter,
    which the CPU run of the model needs, turns every jit function into one the compiler cannot call."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, "-m", "kfuse.sm90_compile", module_path], input=json.dumps(specs),
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"sm_90 compile of {module_path} failed:\n{out.stderr[-4000:]}")
    return [TwinBuild(**b) for b in json.loads(out.stdout.splitlines()[-1])]


def _compile_spec(module, spec: dict) -> TwinBuild:
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    twin = getattr(module, spec["twin"])
    constexprs = {}
    for i, p in enumerate(twin.params):
        if spec["signature"][p.name] == "constexpr":
            constexprs[(i,)] = spec["constexprs"].get(p.name, p._param.default)
    src = GluonASTSource(twin, spec["signature"], constexprs=constexprs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": spec["num_warps"], "maxnreg": spec["maxnreg"]})
    regs, spill = _ptxas_usage(kernel.asm["ptx"])
    return TwinBuild(spec["twin"], kernel.metadata.shared, regs, spill)


def _main(module_path: str) -> None:
    from kfuse.optimize import load_module
    module = load_module(module_path)
    specs = json.loads(sys.stdin.read())
    print(json.dumps([dataclasses.asdict(_compile_spec(module, spec)) for spec in specs]))


def _ptxas_usage(ptx: str) -> tuple[int, int]:
    """Registers and spill-store bytes that ptxas -v reports for sm_90a."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    regs = max(int(line.split("Used ")[1].split()[0]) for line in out.splitlines() if "Used " in line)
    spill = max(int(line.split("bytes spill stores")[0].split(",")[-1]) for line in out.splitlines()
                if "spill stores" in line)
    return regs, spill


if __name__ == "__main__":
    _main(sys.argv[1])
