"""A windowed pool over values already stored as the convolution's NC(D)HW output (y), shared by the kinds that store
y first: a transposed convolution's pool (its stride-phase tile cannot be recomputed per window position) and a pool
after a norm's statistics (the norm needs all of y before any value after it exists).

The pass (`<name>_kernel`): rows are pooled pixels, columns channels. At each window position it loads y at the
position's conv pixel, runs a `transform` (the norm and the ops between it and the pool; nothing for a plain pool),
and max- or sum-combines, with kernels/pooling.py's geometry (window_pixel, avg_divisor); then the ops after the pool
on the pooled tile, stored as NC(D)HW. Bytes: y read once per window position that covers it (from L1/L2 after the
first for overlapping windows), only the pooled outputs written.
"""

from __future__ import annotations

from typing import ClassVar

from kfuse.ir import Graph, Node, Scalar
from kfuse.regions.common import KernelArgs, call, constexpr, docstring, plain, pointwise_lines, signature, var
from kfuse.regions.conv_common import (
    MEANS,
    WINDOWED,
    is_global_mean,
    is_max,
    joins_after_norm,
    joins_after_pool,
)
from kfuse.regions.kind import RegionKind, Walk, numel, same_tile

POOL_SIZES = plain("PM", "QD", "QH", "QW", "PKD", "PKH", "PKW", "PSD", "PSH", "PSW", "PPD", "PPH", "PPW", "PDD", "PDH",
                   "PDW", "DIVISOR")
POOL_PARAMS = ["kernel_size", "pool_stride", "pool_padding", "pool_dilation", "ceil_mode", "count_include_pad",
               "divisor_override"]
# a window position w of each row's pooled pixel: its conv pixel and whether it lies in the conv output
WINDOW_PIXEL = ("od, oh, ow, inside = window_pixel(qd, qh, qw, w, OD, OH, OW, PKH, PKW, PSD, PSH, PSW, PPD, PPH, "
                "PPW, PDD, PDH, PDW)")
# the stored y's value at each row's window position (od, oh, ow) of sample n_idx, every column's channel
Y_AT = ("plane = n_idx.to(tl.int64)[:, None] * C_out + offs_n[None, :]  # (sample, channel) planes of y",
        "pixel = ((od * OH + oh) * OW + ow)[:, None]",
        "y = tl.load(y_ptr + plane * (OD * OH * OW) + pixel, mask=valid[:, None] & mask_n[None, :], other=0.0)")


def is_windowed(n: Node, dims: int) -> bool:
    if n.op == "pool":
        return n.attrs.get("dims") == dims
    return n.op in ("max_pool1d", "avg_pool1d") and dims == 1 and len(n.args) == 2 and isinstance(n.args[1], Scalar)


def read_only_inside(members: list[Node], n: Node, g: Graph) -> bool:
    """Nothing outside the walk (and n, about to join) reads these members: they need never be stored."""
    inside = {m.name for m in members} | {n.name}
    return all(m.name not in g.outputs and all(u.name in inside for u in g.users(m.name)) for m in members)


# ---- a windowed pool or a global mean after a norm kind's statistics ---------------------------------------------
def window_at(members: list[Node]) -> int | None:
    """Where the walk's pool is: a windowed pool, or a global mean of the norm's output."""
    return next((i for i, m in enumerate(members) if m.op in (*WINDOWED, *MEANS)), None)


def joins_norm_then_pool(walk: Walk, n: Node, norm_ops: tuple[str, ...], norm_input: bool, mean: bool = False) -> bool:
    """Does n join a norm kind's walk? Before any pool: the ops joins_after_norm admits, or a windowed pool of a
    value from the norm on at the output's shape, none of those values read outside the region (the pooled pass
    never holds them whole); with `mean`, a mean over every spatial dim of the norm's output itself, nothing else
    reading it (the finalize computes it from the statistics). After the pool: pointwise ops on its shape reading
    pooled values, numbers and per-channel parameters; after a mean, views keeping one value per (sample, channel)."""
    members, g = walk.members, walk.g
    p_at = window_at(members)
    if p_at is not None:
        return joins_after_pool(members, p_at, n)
    if joins_after_norm(walk, n, norm_ops, norm_input):
        return True
    last = members[-1]
    if mean and is_global_mean(n, g) and last.op in norm_ops and n.args[0] == last.name:
        return read_only_inside([last], n, g)
    if not is_windowed(n, walk.anchor.attrs.get("dims", 0)) or not n.args or numel(n.shape) == 0:
        return False
    at = next(i for i, m in enumerate(members) if m.op in norm_ops)
    return (g.shape_of(n.args[0]) == walk.anchor.shape and n.args[0] in {m.name for m in members[at:]}
            and read_only_inside(members[at:], n, g))


class NormThenPool(RegionKind):
    """The walk of a norm kind (its `at_ops` the norms it takes a region over at): joins_norm_then_pool, then
    finish_norm_then_pool. `norm_input`: whether its apply pass may read the norm's input y too; `takes_mean`:
    whether it takes a global mean of the norm's output."""

    norm_input: ClassVar[bool] = True
    takes_mean: ClassVar[bool] = False

    def joins(self, walk: Walk, n: Node) -> bool:
        return joins_norm_then_pool(walk, n, self.at_ops, self.norm_input, self.takes_mean)

    def finish(self, walk: Walk) -> list[Node]:
        return finish_norm_then_pool(walk)


def finish_norm_then_pool(walk: Walk) -> list[Node]:
    """same_tile's members before the pool, then the pool and the ops after it (all on the pooled shape)."""
    p_at = window_at(walk.members)
    if p_at is None:
        return same_tile(walk)
    kept = [m for m in same_tile(walk) if walk.members.index(m) < p_at]
    return kept + walk.members[p_at:] if walk.members[p_at].args[0] in {m.name for m in kept} else kept


def indented(code: str) -> list[str]:
    return [f"    {ln}" for ln in code.splitlines()]


def pooling(pool: Node, y: str) -> tuple[str, list[str], list[str]]:
    """(the start, the combination of one window position's values `y`, the pooled value's line) of a max or avg
    pool over rows of pooled pixels (`inside`: the position lies in the conv output)."""
    if is_max(pool):
        return ("pooled = tl.full((BLOCK_M, BLOCK_N), float('-inf'), tl.float32)",
                [f"y = tl.where(inside[:, None], {y}, float('-inf'))  # the pool's padding: -inf",
                 "pooled = tl.maximum(pooled, y, propagate_nan=tl.PropagateNan.ALL)  # a NaN wins, as in torch"],
                [f"{var(pool.name)} = pooled  # {pool.origin}"])
    return ("pooled = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)",
            [f"pooled += tl.where(inside[:, None], {y}, 0.0)"],
            [f"{var(pool.name)} = pooled / avg_divisor(qd, qh, qw, OD, OH, OW, PKD, PKH, PKW, PSD, PSH, PSW, PPD, PPH, "
             f"PPW, DIVISOR, COUNT_PAD)[:, None]  # {pool.origin}"])


def stored_pool_kernel(name: str, doc: str, pool: Node, after: list[Node], outs: dict[str, str], args: KernelArgs,
                       env: dict[str, str], transform: tuple[list[str], list[str]] = ([], []),
                       extra: tuple[list[str], list[str]] = ([], [])) -> str:
    """`name`: rows = pooled pixels, columns = channels; each window position's y loaded, `transform` (its setup
    lines before the window loop, its lines per position: env[pool's input] from `y`), max / sum; then the ops
    `after` the pool, `outs` (pointer stem -> value) stored as NC(D)HW. `extra`: (pointers, sizes) the transform
    reads, after the outputs' pointers and after C_out."""
    env.setdefault(pool.args[0], "y")
    setup, per_position = transform
    start, combine, finish = pooling(pool, env[pool.args[0]])
    env[pool.name] = var(pool.name)
    post = pointwise_lines(after, env, args)
    lines = ["offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # pooled pixels",
             "offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # channels",
             "mask_m = offs_m < PM",
             "mask_n = offs_n < C_out",
             "mask = mask_m[:, None] & mask_n[None, :]",
             "n_idx, qd, qh, qw = pool_rows(offs_m, QD, QH, QW)", *args.loads, *setup, start,
             "for w in range(0, PKD * PKH * PKW):  # the window's conv pixels",
             *[f"    {ln}" for ln in (WINDOW_PIXEL, "valid = mask_m & inside  # pool padding: nothing read", *Y_AT,
                                      *per_position, *combine)],
             *finish, *post, "out_offs = conv_out_offsets(offs_m, offs_n, QD, QH, QW, C_out)",
             *[f"tl.store({o}_ptr + out_offs, {env[v]}, mask=mask)" for o, v in outs.items()]]
    ptrs, sizes = extra
    decls = (*plain("y_ptr", *[f"{o}_ptr" for o in outs], *ptrs), *args.decls(), *POOL_SIZES,
             *plain("OD", "OH", "OW", "C_out", *sizes), constexpr("COUNT_PAD"), constexpr("BLOCK_M"),
             constexpr("BLOCK_N"))
    return "\n".join(["@triton.jit", f"def {name}({signature(decls)}):", docstring(doc),
                      *[f"    {ln}" for ln in lines]]) + "\n"


def stored_pool_launch(kernel: str, y: str, outs: list[str], args: KernelArgs, extra: tuple[list[str], list[str]] = (
        [], [])) -> list[str]:
    """Launcher lines (after `geo`, and `y` stored): the pool's geometry from its parameters (POOL_PARAMS), the
    pooled outputs, one launch of `kernel` over 64 pooled pixels x 32 channels a program. `extra`: the launch's
    arguments for the kernel's extra pointers and sizes."""
    ptrs, sizes = extra
    return ["pool = pool_geometry(geo, kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode)",
            *[f"{o} = torch.empty(pool.out_shape, device=x.device, dtype=x.dtype)" for o in outs],
            "if pool.M:",
            *indented(call(f"{kernel}[(cdiv(pool.M, 64), cdiv(geo.C_out, 32))]",
                           [y, *outs, *ptrs, *args.params, "*pool.args()", "int(divisor_override or 0)", "geo.OD",
                            "geo.OH", "geo.OW", "geo.C_out", *sizes],
                           ["COUNT_PAD=bool(count_include_pad)", "BLOCK_M=64", "BLOCK_N=32"]))]
