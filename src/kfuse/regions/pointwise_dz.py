"""The fused backward of a GEMM epilogue: dZ in one generated Triton pass (the pointwise ops' part, shared by the
kinds whose backward is fused).

For a region z = x W^T + b -> pointwise ops -> outputs, backward needs dZ = d(outputs)/dz against the upstream
gradients, the epilogue parameters' gradients (scale vectors: sums over the rows) and db = sum_rows dZ. The
generated `<name>_dz_kernel` reads z (saved by the forward kernel) and the upstream gradients once, recomputes
the pointwise chain and runs its reverse in float64 registers (why float64: docs/training.md "Precision of the
backward" -- fp32 torch ops put the gradients at eager's noise level), writes dZ once (x's dtype) and per-block
float64 column sums (db and each parameter), which kernels/backward_ops.py's `epilogue_dz` adds up, and the
column maxima of |dZ|. A program owns a block of rows (ROW_TILES tiles of BLOCK_M) and BLOCK_N columns and keeps
its column sums in registers across its row tiles (tiles from backward_ops.dz_tiles).
Bytes: z + one M*N gradient per output read, dZ written: 12 bytes per element for one output (seed 12:
96 MiB, ~0.035 ms on an H100) where the torch epilogue moved ~8 float64 passes.

The derivative of each op is a row of DERIVATIVES (the pointwise table's companion, ops.py): per operand, a
Triton expression of the local derivative over the operands {0}, {1}, ... and the op's value {y}; None where
the operand is not differentiated (slopes, bounds: always scalars). Conventions at kinks follow torch's
backward formulas (relu: y > 0; leaky_relu: x > 0; hardtanh: strictly inside the bounds; clamp: x >= min).

`dz_kernel` takes `rules` for ops that are not pointwise (a NodeRule: forward lines, reverse lines): a kind with a
norm in its epilogue brings its rule (GroupNorm over whole groups in a tile, BatchNorm); without rules every op is
pointwise.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kfuse.ir import Node, Param, Region, Scalar
from kfuse.ops import POINTWISE, VIEW_OPS
from kfuse.regions.common import Decl, assign, call, constexpr, is_column_vector, is_single, plain, signature, var

_MISH_T = "(_mish_n({0}) / (_mish_n({0}) + 2.0))"  # tanh(softplus(x)) (kernels/pointwise.py)

DERIVATIVES: dict[str, tuple[str | None, ...]] = {
    "add": ("1.0", "1.0"),
    "sub": ("1.0", "-1.0"),
    "mul": ("{1}", "{0}"),
    "div": ("1.0 / {1}", "-{0} / ({1} * {1})"),
    "neg": ("-1.0",),
    "relu": ("tl.where({y} > 0.0, 1.0, 0.0)",),
    "leaky_relu": ("tl.where({0} > 0.0, 1.0, {1})", None),
    "gelu": ("0.5 * (1.0 + tl.math.erf({0} * 0.7071067811865476))"
             " + {0} * 0.3989422804014327 * tl.exp(-0.5 * {0} * {0})",),
    "sigmoid": ("{y} * (1.0 - {y})",),
    "silu": ("tl.sigmoid({0}) * (1.0 + {0} * (1.0 - tl.sigmoid({0})))",),
    "tanh": ("1.0 - {y} * {y}",),
    "hardtanh": ("tl.where(({0} > {1}) & ({0} < {2}), 1.0, 0.0)", None, None),
    "clamp_min": ("tl.where({0} >= {1}, 1.0, 0.0)", None),
    "clamp_max": ("tl.where({0} <= {1}, 1.0, 0.0)", None),
    "softplus": ("tl.where({0} * {1} > {2}, 1.0, tl.sigmoid({0} * {1}))", None, None),
    "mish": (f"{_MISH_T} + {{0}} * tl.sigmoid({{0}}) * (1.0 - {_MISH_T} * {_MISH_T})",),
    "hardswish": ("tl.where({0} < -3.0, 0.0, tl.where({0} <= 3.0, {0} / 3.0 + 0.5, 1.0))",),
    "hardsigmoid": ("tl.where(({0} > -3.0) & ({0} < 3.0), 1.0 / 6.0, 0.0)",),
    "exp": ("{y}",),
    "abs": ("tl.where({0} > 0.0, 1.0, tl.where({0} < 0.0, -1.0, 0.0))",),
    "identity": ("1.0",),
}


def _op(n: Node) -> str:
    return "identity" if n.op in VIEW_OPS else n.op


def stops_gradient(n: Node) -> bool:
    """`y.detach()` is captured as a view (same values, kfuse's forward treats it as identity); its
    gradient is zero, as the torch reference (the user's own call) has it."""
    return n.op in VIEW_OPS and ".detach(" in (n.fx_code or "")


def _param_ok(a: Param, n_cols: int) -> bool:
    return is_single(a) or is_column_vector(a, n_cols)


def pointwise_ok(n: Node, n_cols: int) -> bool:
    """`n` has a derivative row, and every parameter it reads is a column vector or a single value (the
    layouts the forward kernel loads)."""
    d = DERIVATIVES.get(_op(n))
    if d is None or _op(n) not in POINTWISE or len(n.args) != len(d):
        return False
    for a, da in zip(n.args, d):
        if isinstance(a, Param) and (da is None or not _param_ok(a, n_cols)):
            return False
        if isinstance(a, str) and da is None:
            return False
    return True


class Operands:
    """Kernel names for the scalars and parameters the epilogue reads, with the expressions feeding them."""

    def __init__(self) -> None:
        self.params: dict[str, tuple[str, Param]] = {}  # expr -> (kernel name, param)
        self.scalars: dict[str, str] = {}  # expr -> kernel name
        self.loads: list[str] = []
        # a NodeRule's lines before and after the kernel's loop over its row tiles (accumulators it sets up,
        # then stores): e.g. BatchNorm's column statistics
        self.pre: list[str] = []
        self.post: list[str] = []

    def name(self, a, env: dict[str, str]) -> str:
        if isinstance(a, str):
            return env[a]
        if isinstance(a, Scalar):
            # Python floats reach a kernel as fp32: a float64 scalar travels as two fp32 parts (hi + lo holds
            # ~48 bits), so 0.1 is float64's 0.1 here, as in the float64 torch reference
            expr = f"*f64_parts(float({a.expr()}))"
            if expr not in self.scalars:
                name = self.scalars[expr] = f"s{len(self.scalars)}"
                self.loads.append(f"{name} = tl.cast({name}_hi, tl.float64) + tl.cast({name}_lo, tl.float64)")
            return self.scalars[expr]
        if a.expr() not in self.params:
            name = f"p{len(self.params)}"
            self.params[a.expr()] = (name, a)
            load = (f"tl.load({name}_ptr)" if is_single(a) else
                    f"tl.load({name}_ptr + offs_n, mask=mask_n, other=0.0)[None, :]")
            self.loads.append(f"{name} = {load}.to(tl.float64)")
        return self.params[a.expr()][0]


def accumulate(grads: dict[str, str], key: str, term: str, lines: list[str]) -> None:
    """grads[key] += term, as kernel lines (one gradient variable d_<key> per key)."""
    if key in grads:
        lines.append(f"{grads[key]} = {grads[key]} + {term}")
    else:
        grads[key] = f"d_{key}"
        lines.append(f"d_{key} = {term}")


@dataclass(frozen=True)
class NodeRule:
    """How a node that is not a pointwise op enters the dZ kernel (e.g. GroupNorm's, in its kind's file).
    forward(n, ops, env): kernel lines computing n (float64), binding env[n.name] to var(n.name).
    reverse(n, ops, env, grads, lines): kernel lines adding n's operands' gradient terms to `grads` (through
    `accumulate`), given grads[var(n.name)]."""

    forward: Callable[[Node, Operands, dict[str, str]], list[str]]
    reverse: Callable[[Node, Operands, dict[str, str], dict[str, str], list[str]], None]


def pointwise_forward(n: Node, ops: Operands, env: dict[str, str]) -> list[str]:
    names = [ops.name(a, env) for a in n.args]
    env[n.name] = var(n.name)
    return assign(var(n.name), POINTWISE[_op(n)].triton, names, n.origin)


def pointwise_reverse(n: Node, ops: Operands, env: dict[str, str], grads: dict[str, str], rev: list[str]) -> None:
    """Chain rule through one pointwise op: each differentiated operand gets d_out * (local derivative)."""
    names = [ops.name(a, env) for a in n.args]
    for a, da, nm in zip(n.args, DERIVATIVES[_op(n)], names):
        if da is None or isinstance(a, Scalar):
            continue
        local = da.format(*names, y=env[n.name])
        if len(local) > 120:  # a derivative that repeats long operands (mish): short local names first
            rev += [f"u_{i} = {x}" for i, x in enumerate(names)] + [f"u_y = {env[n.name]}"]
            local = da.format(*[f"u_{i}" for i in range(len(names))], y="u_y")
        accumulate(grads, nm, f"{grads[var(n.name)]} * ({local})", rev)


POINTWISE_RULE = NodeRule(pointwise_forward, pointwise_reverse)
ZERO_TILE = "tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)"


def dz_kernel(region: Region, name: str, rules: Mapping[str, NodeRule] | None = None,
              constexprs: tuple[Decl, ...] = (), store_if: str = "") -> tuple[str, list[str], list[str]]:
    """(kernel source, parameter expressions in kernel order, scalar expressions in kernel order).
    rules: op -> NodeRule for the ops that are not pointwise (default: none, every op pointwise);
    constexprs: more kernel parameters they need (e.g. (constexpr("GROUP"),));
    store_if: a constexpr condition for storing dZ and the column sums (a kernel launched in phases, e.g.
    BatchNorm's "PHASE == 2", stores them only in its last)."""
    rules = rules or {}
    ops, env = Operands(), {region.anchor.name: var(region.anchor.name)}
    fwd = [f"{var(region.anchor.name)} = tl.load(z_ptr + tile, mask=mask, other=0.0).to(tl.float64)"]
    for n in region.nodes[1:]:
        fwd += rules.get(n.op, POINTWISE_RULE).forward(n, ops, env)
    # gradients keyed by kernel variable (v_<value> or p<i>): the prefixes keep values and parameters apart
    grads: dict[str, str] = {}
    rev: list[str] = []
    for i, out in enumerate(region.outputs):
        accumulate(grads, var(out), f"tl.load(g{i}_ptr + tile, mask=mask, other=0.0).to(tl.float64)", rev)
    for n in reversed(region.nodes[1:]):
        if var(n.name) not in grads or stops_gradient(n):
            continue
        rules.get(n.op, POINTWISE_RULE).reverse(n, ops, env, grads, rev)
    dz = grads.get(var(region.anchor.name), ZERO_TILE)
    pnames = [nm for nm, _ in ops.params.values()]
    sums = [dz] + [grads.get(p, ZERO_TILE) for p in pnames]  # column-sum slot j: dZ (the bias), then each parameter
    body = [f"tl.store(dz_ptr + tile, {dz}, mask=mask)",
            *[f"col{j} += tl.sum(tl.where(mask, {g}, 0.0), axis=0)" for j, g in enumerate(sums)],
            f"dz_amax = tl.maximum(dz_amax, tl.max(tl.where(mask, tl.abs({dz}), 0.0), axis=0).to(tl.float32))"]
    # the column maxima of |dZ| (as stored: rounding is monotonic) for the split of dZ^T in dW = dZ^T X
    # (backward_ops.split_rows_any), which then skips its own pass over dZ
    tail = [f"tl.store(cols_ptr + ({j} * T + pid_m) * N + offs_n, col{j}, mask=mask_n)" for j in range(len(sums))]
    tail.append("tl.atomic_max(amax_ptr + offs_n, dz_amax, mask=mask_n)")
    if store_if:
        body = [f"if {store_if}:", *[f"    {ln}" for ln in body]]
        tail = [f"if {store_if}:", *[f"    {ln}" for ln in tail]]
    decls = plain("z_ptr", *[f"g{i}_ptr" for i in range(len(region.outputs))], "dz_ptr", "cols_ptr", "amax_ptr",
                  *[f"{p}_ptr" for p in pnames],
                  *[f"{s}_{part}" for s in ops.scalars.values() for part in ("hi", "lo")],
                  "M", "N", "T") + tuple(constexprs) + tuple(constexpr(c) for c in ("BLOCK_M", "BLOCK_N", "ROW_TILES"))
    replaced = " -> ".join(n.origin for n in region.nodes[1:])
    lines = [
        "@triton.jit",
        f"def {name}_dz_kernel({signature(decls)}):",
        *textwrap.wrap(f'"""Backward of the epilogue {replaced}: dZ from z and the upstream gradients, in float64 '
                       "registers; per row block (ROW_TILES tiles of BLOCK_M rows) float64 column sums of dZ (slot 0, "
                       "the bias gradient) and of each parameter's gradient; the column maxima of |dZ| into amax "
                       '(atomic max)."""', 120, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False,
                       break_long_words=False),
        "    pid_m = tl.program_id(0)",
        "    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
        "    mask_n = offs_n < N",
    ]
    lines += [f"    {ln}" for ln in [*ops.loads, *[f"col{j} = tl.zeros((BLOCK_N,), dtype=tl.float64)"
                                                  for j in range(len(sums))],
                                                 "dz_amax = tl.zeros((BLOCK_N,), dtype=tl.float32)", *ops.pre]]
    # the column sums stay in registers across the row tiles (tl.sum over a tile's rows is within each thread
    # when BLOCK_M rows sit in one thread: epilogue_dz's tiles), so a row block writes one partial per column
    lines += ["    for r in range(ROW_TILES):",
              "        offs_m = (pid_m * ROW_TILES + r) * BLOCK_M + tl.arange(0, BLOCK_M)",
              "        mask = (offs_m < M)[:, None] & mask_n[None, :]",
              "        tile = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]"]
    lines += [f"        {ln}" for ln in [*fwd, "# reverse", *rev, *body]]
    lines += [f"    {ln}" for ln in [*tail, *ops.post]]
    return "\n".join(lines) + "\n", list(ops.params), list(ops.scalars)


def _tuple(items: list[str]) -> str:
    return call("", items, indent=12) if len(items) != 1 else f"({items[0]},)"


def dz_method(name: str, params: list[str], scalars: list[str], extra: tuple[str, ...] = ()) -> list[str]:
    """The Function's `fused_dz(model, z, grads)` lines: the generated kernel through epilogue_dz.
    extra: more keyword arguments of epilogue_dz (e.g. "groups=int(self.gn.num_groups)")."""
    line = call("return epilogue_dz", [f"{name}_dz_kernel", "z", "grads", _tuple(params), _tuple(scalars), *extra],
                indent=12)
    return ["", "    @staticmethod", "    def fused_dz(self, z, grads):", f"        {line}"]
