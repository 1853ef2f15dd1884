"""Region kind `gemm_epilogue`: one kernel, the GEMM tile and then a chain of pointwise ops on its fp32
accumulator while it is still in registers.

Bytes: x (M*K) and W (N*K) are read once per tile row/column (W tiles are shared through L2 by the
grouped tile order), the output M*N is written once per stored value; the pointwise chain is free next to
the 2*M*N*K flops. Without fusion each op would read and write M*N again.
"""

from __future__ import annotations

from kfuse.ir import Graph
from kfuse.partition import Region
from kfuse.regions.common import (LAUNCH_TAIL, KernelArgs, RegionCode, gemm_kernel, gemm_setup, kernel_name,
                                  launcher, linear_bias, pointwise_lines, store_line, var)


def epilogue_body(region: Region, env: dict[str, str], args: KernelArgs, outs: dict[str, str]) -> list[str]:
    """Bias, the pointwise chain, and a store of every value read outside the region."""
    body = linear_bias(region.anchor, env, args)
    body += pointwise_lines(list(region.nodes[1:]), env, args)
    body += [store_line(outs[name], var(name)) for name in region.outputs]
    return body


def generate(region: Region, g: Graph) -> RegionCode:
    name = kernel_name(region)
    env: dict[str, str] = {}
    args = KernelArgs()
    outs = {v: f"out{i}" for i, v in enumerate(region.outputs)}
    body = epilogue_body(region, env, args, outs)
    replaced = ", ".join(n.origin for n in region.nodes)
    kernel = gemm_kernel(name, f"Fused: {replaced}.", list(outs.values()), args, body)

    weight, setup = gemm_setup(region.anchor, g)
    extra = list(args.params)
    lines = ["min_block_n = 16"] + setup
    lines += [f"{o} = torch.empty((M, N), device=x.device, dtype=x.dtype)" for o in outs.values()]
    out_args = "".join(f"{o}, " for o in outs.values())
    lines.append(f"{name}_kernel[grid](*ops, {out_args}{''.join(a + ', ' for a in extra)}{LAUNCH_TAIL})")
    lines.append("return " + ", ".join(f"{o}.reshape(*lead, N)" for o in outs.values()))
    launch = launcher(f"fused_{name}", ["x", "weight", *extra], lines, f"Runs {name}_kernel: {replaced}.")

    x = region.anchor.args[0]
    call = f"fused_{name}({x}, {weight}, {args.call()}".rstrip(", ") + ")"
    targets = ", ".join(region.outputs)
    return RegionCode((kernel,), launch, (f"{targets} = {call}",))
