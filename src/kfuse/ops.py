"""Canonical ops, as data.

Pointwise ops are rows of one table: the Triton expression that computes them on a tile (operands are
`{0}`, `{1}`, ... and are always plain names in generated code, so no parentheses are needed around them),
the same as CUDA C++ over fp32 values (the `--backend cuda` epilogues: kfuse/cuda/), and the torch reference
the tests compare against. Capture maps every spelling a user can write
(`x * s`, `torch.mul`, `x.mul`, `nn.LeakyReLU`, `F.leaky_relu`) onto these names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kfuse.ir import attr_expr


@dataclass(frozen=True)
class Pointwise:
    name: str
    arity: int  # operands, tensors or scalars, in order: leaky_relu is (x, negative_slope)
    triton: str  # expression over {0}..{arity-1}
    torch: str  # the same, as torch source: what a ModelNew runs where the op is not fused
    ref: Callable[..., torch.Tensor]  # the same computation in torch, over the same operands
    # the same as a CUDA C++ float expression: float literals only (`0.5f`: a double would promote the math),
    # the accurate libdevice functions (tanhf, erff, expf, log1pf) and kf_max / kf_min, fmaxf / fminf that keep
    # a NaN of their first operand as torch's max/min/clamp do (kfuse/cuda/gemm_source.py defines them)
    cuda: str = ""

    def torch_code(self, *operands: str) -> str:
        return self.torch.format(*operands)


def _p(name: str, arity: int, triton: str, ref: Callable[..., torch.Tensor], code: str, cuda: str) -> Pointwise:
    return Pointwise(name, arity, triton, code, ref, cuda)


# tanh, softplus and erf-GELU are spelled through exp/log/erf, which Triton has on the GPU and in the
# interpreter alike; tanh is `_tanh`, a small jit helper of kernels/runtime.py (a few ulps for every x, where
# 2 sigmoid(2x) - 1 loses the low bits of small x) emitted into the files that call it: spelled inline, its
# expm1 repeated its operand nine times, and tanh(tanh(x)) made a 570-character line. Softplus and Mish are
# spelled inline in forms that stay accurate for very negative inputs (no log(1 + tiny)).
TANH = "_tanh({0})"

POINTWISE: dict[str, Pointwise] = {p.name: p for p in [
    _p("add", 2, "{0} + {1}", torch.add, '({0} + {1})', "{0} + {1}"),
    _p("sub", 2, "{0} - {1}", torch.sub, '({0} - {1})', "{0} - {1}"),
    _p("mul", 2, "{0} * {1}", torch.mul, '({0} * {1})', "{0} * {1}"),
    _p("div", 2, "{0} / {1}", torch.div, '({0} / {1})', "{0} / {1}"),
    _p("neg", 1, "-{0}", torch.neg, '(-{0})', "-{0}"),
    _p("relu", 1, "tl.maximum({0}, 0.0)", torch.relu, 'torch.relu({0})', "kf_max({0}, 0.0f)"),
    _p("leaky_relu", 2, "tl.where({0} >= 0.0, {0}, {0} * {1})", lambda x, a: F.leaky_relu(x, float(a)),
       'torch.nn.functional.leaky_relu({0}, {1})',
       "({0} > 0.0f ? {0} : {0} * {1})"),
    _p("gelu", 1, "0.5 * {0} * (1.0 + tl.math.erf({0} * 0.7071067811865476))", F.gelu,
       'torch.nn.functional.gelu({0})',
       "{0} * 0.5f * (1.0f + erff({0} * 0.707106781186547524f))"),
    _p("gelu_tanh", 1, "0.5 * {0} * (1.0 + _tanh(0.7978845608028654 * ({0} + 0.044715 * {0} * {0} * {0})))",
       lambda x: F.gelu(x, approximate="tanh"), "torch.nn.functional.gelu({0}, approximate='tanh')",
       "0.5f * {0} * (1.0f + tanhf(0.797884560802865356f * ({0} + 0.044715f * ({0} * {0} * {0}))))"),
    _p("sigmoid", 1, "tl.sigmoid({0})", torch.sigmoid, 'torch.sigmoid({0})', "1.0f / (1.0f + expf(-{0}))"),
    _p("silu", 1, "{0} * tl.sigmoid({0})", F.silu, 'torch.nn.functional.silu({0})', "{0} / (1.0f + expf(-{0}))"),
    _p("tanh", 1, TANH, torch.tanh, 'torch.tanh({0})', "tanhf({0})"),
    _p("hardtanh", 3, "tl.minimum(tl.maximum({0}, {1}), {2})", lambda x, lo, hi: torch.clamp(x, float(lo), float(hi)),
       'torch.clamp({0}, {1}, {2})', "kf_min(kf_max({0}, {1}), {2})"),
    _p("clamp_min", 2, "tl.maximum({0}, {1})", lambda x, lo: torch.clamp(x, min=float(lo)),
       'torch.clamp({0}, min={1})', "kf_max({0}, {1})"),
    _p("clamp_max", 2, "tl.minimum({0}, {1})", lambda x, hi: torch.clamp(x, max=float(hi)),
       'torch.clamp({0}, max={1})', "kf_min({0}, {1})"),
    # softplus = log1p(e^(beta x)) / beta, x past the threshold, with an accurate log1p: runtime._softplus (a jit
    # helper, as _tanh: spelled inline it repeated its operands twenty times, lines of 300+ characters)
    _p("softplus", 3, "_softplus({0}, {1}, {2})",
       lambda x, b, t: F.softplus(x, float(b), float(t)), 'torch.nn.functional.softplus({0}, {1}, {2})',
       "({0} * {1} > {2} ? {0} : log1pf(expf({0} * {1})) / {1})"),
    # mish = x * tanh(log(1 + e^x)) = x * n / (n + 2), n = e^x (e^x + 2): no log(1 + tiny) or 2 sigmoid - 1
    # cancellation for negative x; x past softplus's threshold (20) is x, as torch
    _p("mish", 1, "tl.where({0} > 20.0, {0}, {0} * _mish_n({0}) / (_mish_n({0}) + 2.0))", F.mish,
       'torch.nn.functional.mish({0})',  # _mish_n: kernels/pointwise.py
       "{0} * tanhf(log1pf(expf({0})))"),
    _p("hardswish", 1, "{0} * tl.minimum(tl.maximum({0} + 3.0, 0.0), 6.0) / 6.0", F.hardswish,
       'torch.nn.functional.hardswish({0})',
       "{0} * kf_min(kf_max({0} + 3.0f, 0.0f), 6.0f) / 6.0f"),
    _p("hardsigmoid", 1, "tl.minimum(tl.maximum({0} + 3.0, 0.0), 6.0) / 6.0", F.hardsigmoid,
       'torch.nn.functional.hardsigmoid({0})',
       "kf_min(kf_max({0} + 3.0f, 0.0f), 6.0f) / 6.0f"),
    _p("exp", 1, "tl.exp({0})", torch.exp, 'torch.exp({0})', "expf({0})"),
    _p("abs", 1, "tl.abs({0})", torch.abs, 'torch.abs({0})', "fabsf({0})"),
    _p("identity", 1, "{0}", lambda x: x, '{0}', "{0}"),
]}

# Non-pointwise canonical ops that regions are built around.
GEMM_OPS = ("linear", "matmul")
NORM_OPS = ("group_norm", "batch_norm")
# Reductions over one dim (attrs dim, keepdim) and the norms over a whole row (the row-reduction region kind).
REDUCE_OPS = ("sum", "mean", "amax", "amin", "logsumexp")
ROW_NORM_OPS = ("softmax", "log_softmax", "layer_norm", "instance_norm")
POOL_OPS = ("max_pool1d", "avg_pool1d")  # windows of k features of an (M, 1, N) view (the pooling region kind)
VIEW_OPS = ("view",)  # unsqueeze / squeeze / flatten / view / reshape: the shape is the node's
# conv{1,2,3}d: args (x, weight, bias or None); attrs dims, stride, padding, dilation, groups (capture's literals)
CONV_OPS = ("conv",)
CONV_GEOMETRY = ("stride", "padding", "dilation", "groups")
# conv_transpose: the same args, attrs these too, in the order F.conv_transpose{1,2,3}d takes them after the bias
TRANSPOSED_GEOMETRY = ("stride", "padding", "output_padding", "groups", "dilation")


def conv_geometry_code(attrs: Mapping[str, Any], module: str | None,
                       fields: tuple[str, ...] = CONV_GEOMETRY) -> list[str]:
    """A convolution's geometry `fields` (default: stride, padding, dilation and groups; TRANSPOSED_GEOMETRY for a
    transposed one) as generated code: read from its module when ModelNew runs (a ModelNew built with other
    constructor arguments stays right), else the functional call's literals."""
    if module:
        return [f"{attr_expr(module)}.{a}" for a in fields]
    return [repr(attrs[a]) for a in fields]


def is_pointwise(op: str) -> bool:
    return op in POINTWISE
