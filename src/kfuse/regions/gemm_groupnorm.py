"""Region kind `gemm_groupnorm`: GEMM, pointwise ops, GroupNorm and more pointwise ops in one kernel.

GroupNorm normalizes each sample's channels in groups of G = N / num_groups. When G is a power of two (at most
128: wider tiles did not compile on an H100; wider groups are regions/gemm_groupnorm_wide.py) and the column
tile is a multiple of G, every tile holds whole groups, so the statistics are a reduction inside
the tile: reshape (BLOCK_M, BLOCK_N) -> (BLOCK_M, BLOCK_N / G, G) and sum over the last axis. Torch's
semantics exactly: mean, then the biased variance of (x - mean) (two passes over registers, no
E[x^2] - E[x]^2 cancellation), x_hat = (x - mean) / sqrt(var + eps), then the per-channel affine.
Bytes: the same as the plain GEMM; the norm costs no extra pass over the output.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Param
from kfuse.partition import Region
from kfuse.regions.common import (KernelArgs, RegionCode, gemm_region_code, kernel_name, linear_bias,
                                  pointwise_lines, store_lines, var)


def group_norm_lines(n: Node, env: dict[str, str], args: KernelArgs) -> list[str]:
    """Kernel lines normalizing `n`'s input over groups of GROUP columns (a constexpr power of two)."""
    x, _groups, weight, bias, eps = n.args
    v, out = env[x], var(n.name)
    eps_arg = args.operand(eps, env)
    lines = [
        f"# GroupNorm ({n.origin}): statistics of each sample's GROUP consecutive channels",
        f"gx = tl.reshape(tl.where(mask_n[None, :], {v}, 0.0), (BLOCK_M, BLOCK_N // GROUP, GROUP))",
        "g_mean = tl.sum(gx, axis=2) / GROUP",
        "g_dev = gx - g_mean[:, :, None]",
        "g_var = tl.sum(g_dev * g_dev, axis=2) / GROUP  # biased, as torch",
        f"g_rstd = 1.0 / tl.sqrt(g_var + {eps_arg})",
        f"{out} = tl.reshape(g_dev * g_rstd[:, :, None], (BLOCK_M, BLOCK_N))",
    ]
    lines += affine_lines(out, weight, bias, env, args)
    env[n.name] = out
    return lines


def affine_lines(out: str, weight, bias, env: dict[str, str], args: KernelArgs) -> list[str]:
    """GroupNorm's per-channel affine on `out` (each part only where the module has it)."""
    lines = []
    if isinstance(weight, Param):
        lines.append(f"{out} = {out} * {args.operand(weight, env)}")
    if isinstance(bias, Param):
        lines.append(f"{out} = {out} + {args.operand(bias, env)}")
    return lines


def generate(region: Region, g: Graph) -> RegionCode:
    env: dict[str, str] = {}
    args = KernelArgs()
    at = next(i for i, n in enumerate(region.nodes) if n.op == "group_norm")
    norm = region.nodes[at]
    body = linear_bias(region.anchor, env, args)
    body += pointwise_lines(list(region.nodes[1:at]), env, args)
    body += group_norm_lines(norm, env, args)
    body += pointwise_lines(list(region.nodes[at + 1:]), env, args)
    body += store_lines(region, env)
    doc = "Fused: " + ", ".join(n.origin for n in region.nodes) + ". Column tiles hold whole groups of GROUP channels."
    # The group size is read from the module at run time, so a ModelNew built with other sizes stays right.
    pre = (f"n_out = weight.shape[{1 if region.anchor.op == 'matmul' else 0}]",
           "group = tile_group(n_out, groups)",
           "min_block_n = group")
    return gemm_region_code(region, kernel_name(region), args, body, doc, extra_sig="GROUP: tl.constexpr, ",
                            extra_kwargs="GROUP=group, ", pre=pre, extra_params=("groups",),
                            extra_values=(f"int({norm.args[1].expr()})",))
