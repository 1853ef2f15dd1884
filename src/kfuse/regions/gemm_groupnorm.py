"""Region kind `gemm_groupnorm`: GEMM, pointwise ops, GroupNorm and more pointwise ops in one kernel.

GroupNorm normalizes each sample's channels in groups of G = N / num_groups. When G is a power of two (at most
GROUP_MAX = 128: wider tiles did not compile on an H100; wider groups take the two-phase kind) and the column
tile is a multiple of G, every tile holds whole groups, so the statistics are a reduction inside
the tile: reshape (BLOCK_M, BLOCK_N) -> (BLOCK_M, BLOCK_N / G, G) and sum over the last axis. Torch's
semantics exactly: mean, then the biased variance of (x - mean) (two passes over registers, no
E[x^2] - E[x]^2 cancellation), x_hat = (x - mean) / sqrt(var + eps), then the per-channel affine.
Bytes: the same as the plain GEMM; the norm costs no extra pass over the output.

Backward: dZ in one generated Triton pass. For z = x W^T + b -> pointwise ops -> GroupNorm -> pointwise ops ->
outputs, the generated `<name>_dz_kernel` reads z (saved by the forward kernel) and the upstream gradients once
and, per (BLOCK_M x BLOCK_N) tile with BLOCK_N a multiple of G, in float64 registers:
  forward   u = (ops before the norm)(z); per (row, group) mean and rstd = 1 / sqrt(var + eps) of u (biased
            variance of u - mean, torch's group_norm); xhat = (u - mean) * rstd; gn = xhat * gamma + beta;
            outputs = (ops after the norm)(gn, and any earlier value they read);
  reverse   upstream gradients -> post-norm chain backward -> d_gn; d_gamma += d_gn * xhat, d_beta += d_gn;
            dxhat = d_gn * gamma; du = rstd * (dxhat - mean_g(dxhat) - xhat * mean_g(dxhat * xhat));
            pre-norm chain backward -> dz, written in x's dtype;
and float64 column sums of dz (the Linear bias's gradient), d_gamma, d_beta and every other vector
parameter's gradient, kept across the program's row tiles and written once per row block, which `epilogue_dz`
(kernels/backward_ops.py) adds up.
Bytes: z + one M*N gradient per output read, dZ written: 12 bytes per element at fp32 for one output, plus
(1 + parameters) x T x N float64 partials (T row blocks), where the float64 torch epilogue moved ~10 float64
passes over M x N.
The pointwise parts (their forward lines, the DERIVATIVES table, the chain rule, the column sums) are
regions/pointwise_dz.py's; this module adds the GroupNorm node's NodeRule. A region whose ops are not all
covered (an op without a derivative row, a norm whose group size, affine or eps is not the plain layout)
gets no kernel: its Function keeps the float64 torch backward.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Param, Region, Scalar
from kfuse.regions.common import (
    KernelArgs,
    RegionCode,
    affine_lines,
    constexpr,
    gemm_cost,
    gemm_region_code,
    linear_bias,
    pointwise_lines,
    store_lines,
    var,
)
from kfuse.regions.kind import EpilogueKind, Walk, group_size, norm_of_tile, whole_groups_in_tile
from kfuse.regions.pointwise_dz import NodeRule, Operands, accumulate, dz_kernel, pointwise_ok


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


GROUP_CONSTEXPR = (constexpr("GROUP"),)  # channels per group: N // num_groups, read at run time
# kernel variables of the norm (one per region): no value (v_<name>), parameter (p<i>), scalar (s<i>) or
# gradient (d_...) variable starts with gn_ or g_
RSTD, XHAT, DOUT = "gn_rstd", "gn_xhat", "gn_dout"


def _norm_args_ok(n: Node, n_cols: int) -> bool:
    """A value input, a number of groups the one-kernel GroupNorm takes at this width, gamma and beta each a
    (N,) parameter or absent (affine=False), eps a number."""
    if len(n.args) != 5:
        return False
    x, groups, weight, bias, eps = n.args
    affine_ok = all(a is None or (isinstance(a, Param) and a.shape == (n_cols,)) for a in (weight, bias))
    return (isinstance(x, str) and isinstance(groups, Scalar) and isinstance(eps, Scalar) and affine_ok
            and (size := group_size(n, n_cols)) is not None and whole_groups_in_tile(size))


def groupnorm_dz_supported(region: Region) -> bool:
    """One GroupNorm over a 2-d GEMM output, every other op after the GEMM pointwise with a derivative row."""
    if len(region.anchor.shape) != 2:
        return False
    n_cols = region.anchor.shape[-1]
    norms = [n for n in region.nodes[1:] if n.op == "group_norm"]
    if len(norms) != 1 or not _norm_args_ok(norms[0], n_cols):
        return False
    return all(n.op == "group_norm" or pointwise_ok(n, n_cols) for n in region.nodes[1:])


def _grouped(tile: str) -> str:
    """A (BLOCK_M, BLOCK_N) tile as (BLOCK_M, groups in the tile, GROUP): a tile starts at a multiple of GROUP."""
    return f"tl.reshape({tile}, (BLOCK_M, BLOCK_N // GROUP, GROUP))"


def _flat(tile3: str) -> str:
    return f"tl.reshape({tile3}, (BLOCK_M, BLOCK_N))"


def groupnorm_forward(n: Node, ops: Operands, env: dict[str, str]) -> list[str]:
    """The forward kernel's statistics (regions/gemm_groupnorm.py group_norm_lines) in float64, keeping the
    per-group rstd and xhat (grouped layout) for the reverse."""
    x, _groups, weight, bias, eps = n.args
    rstd, xhat = RSTD, XHAT
    out = var(n.name)
    # masked columns (past N) are whole groups (N is a multiple of GROUP): zeros keep their statistics finite
    lines = [
        f"# GroupNorm ({n.origin}): statistics of each row's GROUP consecutive channels, as torch's group_norm",
        f"g_x = {_grouped(f'tl.where(mask, {env[x]}, 0.0)')}",
        "g_mean = tl.sum(g_x, axis=2) / GROUP",
        "g_dev = g_x - g_mean[:, :, None]",
        "g_var = tl.sum(g_dev * g_dev, axis=2) / GROUP  # biased, as torch",
        f"{rstd} = 1.0 / tl.sqrt(g_var + {ops.name(eps, env)})",
        f"{xhat} = g_dev * {rstd}[:, :, None]",
        f"{out} = {_flat(xhat)}",
    ]
    if isinstance(weight, Param):
        lines.append(f"{out} = {out} * {ops.name(weight, env)}")
    if isinstance(bias, Param):
        lines.append(f"{out} = {out} + {ops.name(bias, env)}")
    env[n.name] = out
    return lines


def groupnorm_reverse(n: Node, ops: Operands, env: dict[str, str], grads: dict[str, str], rev: list[str]) -> None:
    """GroupNorm's backward: gamma's and beta's gradient tiles (summed over rows by the kernel's tail), and
    du = rstd * (dxhat - mean_g(dxhat) - xhat * mean_g(dxhat * xhat)) for its input."""
    x, _groups, weight, bias, _eps = n.args
    rstd, xhat = RSTD, XHAT
    d_out = DOUT
    # zeros outside the tile's valid part: a derivative there (0 * inf) must not reach a group's means
    rev.append(f"{d_out} = tl.where(mask, {grads[var(n.name)]}, 0.0)  # backward of {n.origin}")
    if isinstance(weight, Param):
        accumulate(grads, ops.name(weight, env), f"{d_out} * {_flat(xhat)}", rev)
    if isinstance(bias, Param):
        accumulate(grads, ops.name(bias, env), d_out, rev)
    dxhat = f"{d_out} * {ops.name(weight, env)}" if isinstance(weight, Param) else d_out
    rev += [
        f"g_dxhat = {_grouped(dxhat)}",
        "g_m1 = tl.sum(g_dxhat, axis=2) / GROUP",
        f"g_m2 = tl.sum(g_dxhat * {xhat}, axis=2) / GROUP",
    ]
    du = f"{rstd}[:, :, None] * (g_dxhat - g_m1[:, :, None] - {xhat} * g_m2[:, :, None])"
    accumulate(grads, env[x], _flat(du), rev)


GROUPNORM_RULE = NodeRule(groupnorm_forward, groupnorm_reverse)


def groupnorm_dz_kernel(region: Region, name: str) -> tuple[str, list[str], list[str], tuple[str, ...]]:
    """(kernel source, parameter and scalar expressions in kernel order, the extra epilogue_dz argument that
    gives the kernel its number of groups)."""
    src, params, scalars = dz_kernel(region, name, {"group_norm": GROUPNORM_RULE}, GROUP_CONSTEXPR)
    norm = next(n for n in region.nodes if n.op == "group_norm")
    return src, params, scalars, (f"groups=int({norm.args[1].expr()})",)


class GemmGroupNorm(EpilogueKind):
    name = "gemm_groupnorm"
    family = "gemm"
    at_ops = ("group_norm",)

    def enters(self, walk: Walk, n: Node) -> bool:
        """A GroupNorm over the GEMM's columns whose groups a column tile holds whole."""
        size = group_size(n, walk.anchor.shape[-1]) if norm_of_tile(walk, n, "group_norm") else None
        return size is not None and whole_groups_in_tile(size)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        env: dict[str, str] = {}
        args = KernelArgs()
        at = next(i for i, n in enumerate(region.nodes) if n.op == "group_norm")
        norm = region.nodes[at]
        body = linear_bias(region.anchor, env, args)
        body += pointwise_lines(list(region.nodes[1:at]), env, args)
        body += group_norm_lines(norm, env, args)
        body += pointwise_lines(list(region.nodes[at + 1:]), env, args)
        body += store_lines(region, env)
        doc = ("Fused: " + ", ".join(n.origin for n in region.nodes)
               + ". Column tiles hold whole groups of GROUP channels.")
        # The group size is read from the module at run time, so a ModelNew built with other sizes stays right.
        pre = (f"n_out = weight.shape[{1 if region.anchor.op == 'matmul' else 0}]",
               "group = tile_group(n_out, groups)",
               "min_block_n = group")
        return gemm_region_code(region, stem, args, body, doc, extra_sig=(constexpr("GROUP"),),
                                cost=gemm_cost(region, g),
                                extra_kwargs=("GROUP=group",), pre=pre, extra_params=("groups",),
                                extra_values=(f"int({norm.args[1].expr()})",))

    def dz_plan(self, region: Region, stem: str) -> tuple[str, list[str], list[str], tuple[str, ...]] | None:
        return groupnorm_dz_kernel(region, stem) if groupnorm_dz_supported(region) else None


KIND = GemmGroupNorm()
