"""Stage 2, capture: torch.fx symbolic tracing -> kfuse's Graph of canonical ops.

Modules stay whole (nn.Linear, nn.GroupNorm, nn.BatchNorm1d are leaves of the trace), so a node knows the
submodule whose parameters and training flag it reads at run time. Each call form maps to a canonical op
through a spec function with the callee's signature: calling it with the traced arguments binds them the
way Python would and returns `(op, operands, attrs)`. A call with no rule, or that its rule rejects, is
kept as an `unknown` node and later emitted as the original torch call.
"""

from __future__ import annotations

import contextlib
import copy
import io
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.node import _get_qualified_name
from torch.fx.passes.shape_prop import ShapeProp

from kfuse.ir import Arg, Graph, Node, Param, Scalar, attr_expr
from kfuse.trace import Untraceable, functionalize, trace

Spec = Callable[..., tuple[str, tuple[Any, ...], dict[str, Any]]]


class Reject(Exception):
    """A spec saw a form it does not fuse (e.g. add with alpha != 1): keep the call as it is."""


# ---- call forms -> canonical ops ---------------------------------------------------------------
def _binary(op: str) -> Spec:
    def spec(input: Any, other: Any, *, alpha: Any = 1, out: Any = None) -> tuple:
        if alpha != 1 or out is not None:
            raise Reject
        return op, (input, other), {}
    return spec


def _rbinary(op: str) -> Spec:  # torch.rsub(x, y) = y - x
    def spec(input: Any, other: Any, *, alpha: Any = 1) -> tuple:
        if alpha != 1:
            raise Reject
        return op, (other, input), {}
    return spec


def _unary(op: str) -> Spec:
    def spec(input: Any, inplace: bool = False) -> tuple:
        return op, (input,), {}
    return spec


def _leaky_relu(input: Any, negative_slope: float = 0.01, inplace: bool = False) -> tuple:
    return "leaky_relu", (input, negative_slope), {}


def _gelu(input: Any, approximate: str = "none") -> tuple:
    return ("gelu_tanh" if approximate == "tanh" else "gelu"), (input,), {}


def _hardtanh(input: Any, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> tuple:
    return "hardtanh", (input, min_val, max_val), {}


def _clamp(input: Any, min: Any = None, max: Any = None) -> tuple:
    if isinstance(min, torch.fx.Node) or isinstance(max, torch.fx.Node):
        raise Reject
    if min is not None and max is not None:
        return "hardtanh", (input, min, max), {}
    if min is not None:
        return "clamp_min", (input, min), {}
    if max is not None:
        return "clamp_max", (input, max), {}
    raise Reject


def _softplus(input: Any, beta: float = 1.0, threshold: float = 20.0) -> tuple:
    return "softplus", (input, beta, threshold), {}


def _linear(input: Any, weight: Any, bias: Any = None) -> tuple:
    return "linear", (input, weight, bias), {}


def _matmul(input: Any, other: Any) -> tuple:
    return "matmul", (input, other), {}


def _group_norm(input: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> tuple:
    return "group_norm", (input, num_groups, weight, bias, eps), {}


def _instance_norm(input: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None, bias: Any = None,
                   use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5) -> tuple:
    """F.instance_norm with the input's own statistics and no running ones on (N, C, spatial...); else kept."""
    if running_mean is not None or running_var is not None or use_input_stats is not True or len(_shape(input)) < 3:
        raise Reject
    return "instance_norm", (input, weight, bias, eps), {}


def _dim(dim: Any) -> int:
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise Reject  # a full reduction (dim=None) or several dims: not a row reduction
    return dim


def _reduce(op: str) -> Spec:
    """sum / mean / amax / amin / logsumexp over one dim; `dtype=` and friends are kept as torch calls."""
    def spec(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None, out: Any = None) -> tuple:
        if dtype is not None or out is not None:
            raise Reject
        return op, (input,), {"dim": _dim(dim), "keepdim": bool(keepdim)}
    return spec


def _max_dim(op: str) -> Spec:
    """torch.max(x, dim) / x.max(dim): (values, indices); only the values are used (checked by capture).
    torch.max(x, y) with a tensor y is the elementwise maximum."""
    def spec(input: Any, dim: Any = None, keepdim: bool = False, *, out: Any = None) -> tuple:
        if isinstance(dim, torch.fx.Node) and out is None:
            return ("clamp_min" if op == "amax" else "clamp_max"), (input, dim), {}  # torch.clamp takes tensors
        if dim is None or out is not None or not isinstance(dim, int):
            raise Reject  # torch.max(x) (a full reduction)
        return op, (input,), {"dim": dim, "keepdim": bool(keepdim), "tuple": True}
    return spec


def _softmax(op: str) -> Spec:
    def spec(input: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> tuple:
        if dtype is not None or dim is None:
            raise Reject
        return op, (input,), {"dim": _dim(dim)}
    return spec


def _layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> tuple:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    return "layer_norm", (input, weight, bias, eps), {"normalized_shape": shape}


def _dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> tuple:
    if not isinstance(p, (int, float)) or not isinstance(training, bool):
        raise Reject
    return "dropout", (input,), {"p": float(p), "training": training}


def _view(input: Any, *shape: Any, **kwargs: Any) -> tuple:
    """view/reshape/flatten/(un)squeeze: the result's shape comes from the trace, so sizes may be literals or read
    from tensors (`x.view(x.size(0), -1)`); fused only where it adds or removes size-1 dims (partition.py), and
    otherwise run as written, sizes and all."""
    return "view", (input,), {}


def _alias(input: Any, *args: Any, **kwargs: Any) -> tuple:
    """A transpose or permutation: a view of the same storage (no kernel), run as written; a GEMM reads it
    through its strides."""
    return "alias", (input,), {}


def einsum_as_matmul(equation: str, ranks: tuple[int, int]) -> bool:
    """Is `einsum(equation, a, b)` exactly torch.matmul(a, b)? "ij,jk->ik", "bij,bjk->bik", "bijl,lk->bijk": a's
    last index is summed against b's second-to-last, b's other leading indices are a's (broadcast as matmul
    does), and the output lists a's free indices then b's last."""
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq or eq.count(",") != 1:
        return False
    ins, out = eq.split("->")
    a, b = ins.split(",")
    if (len(a), len(b)) != ranks or len(a) < 2 or len(b) < 2 or len(set(a)) != len(a) or len(set(b)) != len(b):
        return False
    k = a[-1]
    return (b[-2] == k and k not in out and out == a[:-1] + b[-1] and b[-1] not in a
            and (len(b) == 2 or b[:-2] == a[len(a) - len(b):-2]))


def _einsum(equation: Any, *operands: Any) -> tuple:
    if len(operands) == 1 and isinstance(operands[0], (tuple, list)):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or len(operands) != 2 or not all(isinstance(o, torch.fx.Node) for o in operands):
        raise Reject
    ranks = tuple(len(o.meta["tensor_meta"].shape) if "tensor_meta" in o.meta else -1 for o in operands)
    if not einsum_as_matmul(equation, ranks):
        raise Reject
    return "matmul", tuple(operands), {}


FUNCTIONS: dict[Any, Spec] = {
    operator.add: _binary("add"), torch.add: _binary("add"),
    operator.sub: _binary("sub"), torch.sub: _binary("sub"), torch.rsub: _rbinary("sub"),
    operator.mul: _binary("mul"), torch.mul: _binary("mul"), torch.multiply: _binary("mul"),
    operator.truediv: _binary("div"), torch.div: _binary("div"),
    operator.neg: _unary("neg"), torch.neg: _unary("neg"),
    torch.relu: _unary("relu"), F.relu: _unary("relu"),
    F.leaky_relu: _leaky_relu, F.gelu: _gelu,
    torch.sigmoid: _unary("sigmoid"), F.sigmoid: _unary("sigmoid"),
    torch.tanh: _unary("tanh"), F.tanh: _unary("tanh"),
    F.silu: _unary("silu"), F.mish: _unary("mish"), F.hardswish: _unary("hardswish"),
    F.hardsigmoid: _unary("hardsigmoid"), F.softplus: _softplus,
    F.hardtanh: _hardtanh, torch.clamp: _clamp, torch.clip: _clamp,
    torch.exp: _unary("exp"), torch.abs: _unary("abs"),
    F.linear: _linear, torch.matmul: _matmul, operator.matmul: _matmul, torch.mm: _matmul, torch.bmm: _matmul,
    torch.einsum: _einsum, torch.transpose: _alias, torch.t: _alias, torch.permute: _alias,
    F.group_norm: _group_norm, F.instance_norm: _instance_norm,
    torch.sum: _reduce("sum"), torch.mean: _reduce("mean"), torch.amax: _reduce("amax"), torch.amin: _reduce("amin"),
    torch.logsumexp: _reduce("logsumexp"), torch.max: _max_dim("amax"), torch.min: _max_dim("amin"),
    torch.softmax: _softmax("softmax"), F.softmax: _softmax("softmax"),
    torch.log_softmax: _softmax("log_softmax"), F.log_softmax: _softmax("log_softmax"),
    F.layer_norm: _layer_norm, F.dropout: _dropout,
    torch.maximum: _binary("clamp_min"), torch.minimum: _binary("clamp_max"),
    torch.unsqueeze: _view, torch.squeeze: _view, torch.flatten: _view, torch.reshape: _view,
}

METHODS: dict[str, Spec] = {
    "add": _binary("add"), "sub": _binary("sub"), "mul": _binary("mul"), "multiply": _binary("mul"),
    "div": _binary("div"),
    "neg": _unary("neg"), "relu": _unary("relu"), "sigmoid": _unary("sigmoid"), "tanh": _unary("tanh"),
    "clamp": _clamp, "clip": _clamp, "exp": _unary("exp"), "abs": _unary("abs"),
    "matmul": _matmul, "mm": _matmul, "bmm": _matmul, "t": _alias, "transpose": _alias, "permute": _alias,
    "mT": _alias,
    "sum": _reduce("sum"), "mean": _reduce("mean"), "amax": _reduce("amax"), "amin": _reduce("amin"),
    "logsumexp": _reduce("logsumexp"), "max": _max_dim("amax"), "min": _max_dim("amin"),
    "softmax": _softmax("softmax"), "log_softmax": _softmax("log_softmax"),
    "clone": _unary("identity"), "contiguous": _unary("identity"), "detach": _view,
    "unsqueeze": _view, "squeeze": _view, "flatten": _view, "view": _view, "reshape": _view,
}


OPERATOR_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "pow": "**",
                    "matmul": "@", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
                    "and_": "&", "or_": "|", "xor": "^", "lshift": "<<", "rshift": ">>"}
# Host values: a tensor's sizes and the Python arithmetic on them (`x.view(x.size(0), -1)`), no data touched.
HOST_METHODS = frozenset({"size", "dim", "numel", "stride", "nelement", "ndimension", "element_size", "get_device",
                          "is_contiguous"})
HOST_ATTRS = frozenset({"shape", "ndim", "dtype", "device", "is_cuda"})


def _module_linear(path: str, m: nn.Linear, x: Any) -> tuple:
    bias = Param(f"{path}.bias", tuple(m.bias.shape)) if m.bias is not None else None
    return "linear", (x, Param(f"{path}.weight", tuple(m.weight.shape)), bias), {}


def _module_scalar(op: str, *attrs: str) -> Callable[..., tuple]:
    """A module whose op takes scalars stored on the module (read at run time from `self.<path>.<attr>`)."""
    def rule(path: str, m: nn.Module, x: Any) -> tuple:
        return op, (x, *[Scalar(float(getattr(m, a)), f"{path}.{a}") for a in attrs]), {}
    return rule


def _module_gelu(path: str, m: nn.GELU, x: Any) -> tuple:
    return ("gelu_tanh" if m.approximate == "tanh" else "gelu"), (x,), {}


def _module_softplus(path: str, m: nn.Softplus, x: Any) -> tuple:
    return "softplus", (x, Scalar(float(m.beta), f"{path}.beta"), Scalar(float(m.threshold), f"{path}.threshold")), {}


def _module_group_norm(path: str, m: nn.GroupNorm, x: Any) -> tuple:
    # affine with bias=False (torch >= 2.x) has a weight and no bias
    w = Param(f"{path}.weight", tuple(m.weight.shape)) if getattr(m, "weight", None) is not None else None
    b = Param(f"{path}.bias", tuple(m.bias.shape)) if getattr(m, "bias", None) is not None else None
    return "group_norm", (x, Scalar(m.num_groups, f"{path}.num_groups"), w, b, Scalar(m.eps, f"{path}.eps")), {}


def _module_batch_norm(path: str, m: nn.BatchNorm1d, x: Any) -> tuple:
    # Parameters, buffers, momentum, eps and the training flag are all read from the module at run time.
    return "batch_norm", (x,), {"affine": m.affine, "track_running_stats": m.track_running_stats}


def _module_dropout(path: str, m: nn.Dropout, x: Any) -> tuple:
    # p is kept for the p == 0 rewrite; the training flag is the module's, read when it runs (modes.py), and
    # the mode at capture only says which of ModelNew's forwards the contract checks
    return "dropout", (x,), {"p": float(m.p), "captured_training": m.training}


def _module_softmax(op: str) -> Callable[..., tuple]:
    def rule(path: str, m: nn.Module, x: Any) -> tuple:
        if m.dim is None:
            raise Reject
        return op, (x,), {"dim": int(m.dim)}
    return rule


def _module_layer_norm(path: str, m: nn.LayerNorm, x: Any) -> tuple:
    w = Param(f"{path}.weight", tuple(m.weight.shape)) if m.weight is not None else None
    b = Param(f"{path}.bias", tuple(m.bias.shape)) if m.bias is not None else None
    return "layer_norm", (x, w, b, Scalar(m.eps, f"{path}.eps")), {"normalized_shape": tuple(m.normalized_shape)}


def _module_instance_norm(path: str, m: nn.InstanceNorm1d, x: Any) -> tuple:
    # Running statistics (track_running_stats=True) make eval mode differ: kept as a torch call.
    if m.track_running_stats:
        raise Reject
    w = Param(f"{path}.weight", tuple(m.weight.shape)) if m.affine else None
    b = Param(f"{path}.bias", tuple(m.bias.shape)) if m.affine else None
    return "instance_norm", (x, w, b, Scalar(m.eps, f"{path}.eps")), {}


def _module_instance_norm_nd(rank: int) -> Callable[..., tuple]:
    """InstanceNorm2d/3d on a batched input (N, C, spatial...): per (sample, channel) over the spatial dims. An
    unbatched one (a rank lower) normalizes another way: kept as a torch call."""
    def rule(path: str, m: nn.Module, x: Any) -> tuple:
        if len(_shape(x)) != rank:
            raise Reject
        return _module_instance_norm(path, m, x)
    return rule


def _pool(op: str, k: Any, stride: Any, padding: Any, ceil_mode: Any, extra_ok: bool, k_attr: str | None) -> tuple:
    """1-d pooling in non-overlapping windows (stride = kernel, no padding, floor): fused; anything else kept."""
    k1 = k[0] if isinstance(k, (tuple, list)) and len(k) == 1 else k
    s1 = stride[0] if isinstance(stride, (tuple, list)) and len(stride) == 1 else stride
    p1 = padding[0] if isinstance(padding, (tuple, list)) and len(padding) == 1 else padding
    if not isinstance(k1, int) or s1 not in (None, k1) or p1 != 0 or ceil_mode or not extra_ok:
        raise Reject
    if k_attr is None:  # a call's literal: capture turns it into a Scalar
        return op, (k1,), {}
    return op, (Scalar(k1, k_attr if isinstance(k, int) else None),), {}


def _module_max_pool(path: str, m: nn.MaxPool1d, x: Any) -> tuple:
    op, args, attrs = _pool("max_pool1d", m.kernel_size, m.stride, m.padding, m.ceil_mode,
                            m.dilation in (1, (1,)) and not m.return_indices, f"{path}.kernel_size")
    return op, (x, *args), attrs


def _module_avg_pool(path: str, m: nn.AvgPool1d, x: Any) -> tuple:
    op, args, attrs = _pool("avg_pool1d", m.kernel_size, m.stride, m.padding, m.ceil_mode, True, f"{path}.kernel_size")
    return op, (x, *args), attrs


def _f_max_pool(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                ceil_mode: bool = False, return_indices: bool = False) -> tuple:
    op, args, attrs = _pool("max_pool1d", kernel_size, stride, padding, ceil_mode,
                            dilation in (1, (1,)) and not return_indices, None)
    return op, (input, *args), attrs


def _f_avg_pool(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                count_include_pad: bool = True) -> tuple:
    op, args, attrs = _pool("avg_pool1d", kernel_size, stride, padding, ceil_mode, True, None)
    return op, (input, *args), attrs


def _conv_attrs(dims: int, stride: Any, padding: Any, dilation: Any, groups: Any) -> dict[str, Any]:
    """A convolution's geometry as literals (ints, int tuples, 'same' / 'valid'); anything computed is kept as
    written (Reject)."""
    def literal(v: Any) -> bool:
        return (isinstance(v, int) and not isinstance(v, bool)) or (
            isinstance(v, (tuple, list)) and all(isinstance(e, int) and not isinstance(e, bool) for e in v))
    if not (literal(stride) and literal(dilation) and (literal(padding) or padding in ("same", "valid"))
            and isinstance(groups, int) and not isinstance(groups, bool)):
        raise Reject
    return {"dims": dims, "stride": _as_tuple(stride), "padding": _as_tuple(padding),
            "dilation": _as_tuple(dilation), "groups": groups}


def _as_tuple(v: Any) -> Any:
    return tuple(v) if isinstance(v, (tuple, list)) else v


def _module_conv(path: str, m: nn.Conv2d, x: Any) -> tuple:
    """nn.Conv1d/2d/3d with zero padding; the launcher reads stride, padding, dilation and groups from the module."""
    if m.padding_mode != "zeros":
        raise Reject
    bias = Param(f"{path}.bias", tuple(m.bias.shape)) if m.bias is not None else None
    attrs = _conv_attrs(len(m.kernel_size), m.stride, m.padding, m.dilation, m.groups)
    return "conv", (x, Param(f"{path}.weight", tuple(m.weight.shape)), bias), attrs


def _f_conv(dims: int) -> Spec:
    def spec(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
             groups: Any = 1) -> tuple:
        return "conv", (input, weight, bias), _conv_attrs(dims, stride, padding, dilation, groups)
    return spec


# ConvTranspose: op `conv_transpose`, args (x, weight, bias or None); attrs dims and ops.TRANSPOSED_GEOMETRY


def _transposed_attrs(dims: int, stride: Any, padding: Any, output_padding: Any, groups: Any,
                      dilation: Any) -> dict[str, Any]:
    """_conv_attrs plus output_padding; padding as ints or tuples only (transposed convolutions take no 'same')."""
    if isinstance(padding, str) or isinstance(output_padding, str):
        raise Reject
    _conv_attrs(dims, stride, output_padding, dilation, groups)  # output_padding: literals, as the padding
    return {**_conv_attrs(dims, stride, padding, dilation, groups), "output_padding": _as_tuple(output_padding)}


def _module_conv_transpose(path: str, m: nn.ConvTranspose2d, x: Any) -> tuple:
    """nn.ConvTranspose1d/2d/3d (forward without output_size: capture rejects extra call arguments); the launcher
    reads the geometry from the module."""
    if m.padding_mode != "zeros":
        raise Reject
    bias = Param(f"{path}.bias", tuple(m.bias.shape)) if m.bias is not None else None
    attrs = _transposed_attrs(len(m.kernel_size), m.stride, m.padding, m.output_padding, m.groups, m.dilation)
    return "conv_transpose", (x, Param(f"{path}.weight", tuple(m.weight.shape)), bias), attrs


def _f_conv_transpose(dims: int) -> Spec:
    def spec(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, output_padding: Any = 0,
             groups: Any = 1, dilation: Any = 1) -> tuple:
        return "conv_transpose", (input, weight, bias), _transposed_attrs(dims, stride, padding, output_padding,
                                                                          groups, dilation)
    return spec


def _module_flatten(path: str, m: nn.Flatten, x: Any) -> tuple:
    return "view", (x,), {}


MODULES: dict[type, Callable[..., tuple]] = {
    nn.Linear: _module_linear,
    nn.ReLU: _module_scalar("relu"),
    nn.LeakyReLU: _module_scalar("leaky_relu", "negative_slope"),
    nn.GELU: _module_gelu,
    nn.SiLU: _module_scalar("silu"), nn.Sigmoid: _module_scalar("sigmoid"), nn.Tanh: _module_scalar("tanh"),
    nn.Mish: _module_scalar("mish"), nn.Hardswish: _module_scalar("hardswish"),
    nn.Hardsigmoid: _module_scalar("hardsigmoid"),
    nn.Hardtanh: _module_scalar("hardtanh", "min_val", "max_val"),
    nn.Softplus: _module_softplus,
    nn.Identity: _module_scalar("identity"),
    nn.GroupNorm: _module_group_norm,
    # BatchNorm2d/3d: per-channel statistics over (N, spatial), the same op; a 2-d GEMM output takes only
    # BatchNorm1d's shape, a convolution's the others (regions/kind.py's kinds check the shapes)
    nn.BatchNorm1d: _module_batch_norm, nn.BatchNorm2d: _module_batch_norm, nn.BatchNorm3d: _module_batch_norm,
    nn.Dropout: _module_dropout,
    nn.Softmax: _module_softmax("softmax"), nn.LogSoftmax: _module_softmax("log_softmax"),
    nn.MaxPool1d: _module_max_pool, nn.AvgPool1d: _module_avg_pool,
    nn.LayerNorm: _module_layer_norm, nn.InstanceNorm1d: _module_instance_norm, nn.Flatten: _module_flatten,
    nn.InstanceNorm2d: _module_instance_norm_nd(4), nn.InstanceNorm3d: _module_instance_norm_nd(5),
}
FUNCTIONS.update({F.conv1d: _f_conv(1), F.conv2d: _f_conv(2), F.conv3d: _f_conv(3)})
MODULES.update({nn.Conv1d: _module_conv, nn.Conv2d: _module_conv, nn.Conv3d: _module_conv})
FUNCTIONS.update({F.conv_transpose1d: _f_conv_transpose(1), F.conv_transpose2d: _f_conv_transpose(2),
                  F.conv_transpose3d: _f_conv_transpose(3)})
MODULES.update({nn.ConvTranspose1d: _module_conv_transpose, nn.ConvTranspose2d: _module_conv_transpose,
                nn.ConvTranspose3d: _module_conv_transpose})
FUNCTIONS[F.max_pool1d] = _f_max_pool
FUNCTIONS[F.avg_pool1d] = _f_avg_pool
# ReLU6 is a Hardtanh subclass with fixed bounds; exact-type lookup keeps it apart from Hardtanh.
MODULES[nn.ReLU6] = _module_scalar("hardtanh", "min_val", "max_val")


# ---- pools over a convolution's spatial dims (a region kind fuses them with it: kernels/pooling.py) -------------
# `pool`: MaxPool/AvgPool 1d/2d/3d and F.max_pool/avg_pool{1,2,3}d at any literal geometry (a 1-d pool in
# non-overlapping windows stays max_pool1d / avg_pool1d, which the GEMM's pooling kind reads); attrs say which
# and where. `mean_dims`: a mean over several dims (x.mean((2, 3))) and AdaptiveAvgPool to one pixel.
POOL_DEFAULTS = {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "count_include_pad": True,
                 "divisor_override": None}


def _literal_ints(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (
        isinstance(v, (tuple, list)) and all(isinstance(e, int) and not isinstance(e, bool) for e in v))


def _pool_nd(mode: str, dims: int, kernel_size: Any, **geometry: Any) -> tuple:
    """op `pool` (args: the input), its geometry as literals; computed values or return_indices: kept as written."""
    attrs = {**POOL_DEFAULTS, **geometry, "mode": mode, "dims": dims, "kernel_size": _as_tuple(kernel_size)}
    stride = attrs["stride"]
    if not (_literal_ints(kernel_size) and (stride in (None, [], ()) or _literal_ints(stride))
            and _literal_ints(attrs["padding"]) and _literal_ints(attrs["dilation"])
            and isinstance(attrs["ceil_mode"], bool) and isinstance(attrs["count_include_pad"], bool)
            and (attrs["divisor_override"] is None or _literal_ints(attrs["divisor_override"]))):
        raise Reject
    return "pool", {k: _as_tuple(v) for k, v in attrs.items()}


def _module_pool(mode: str, dims: int, one_d: Callable[..., tuple] | None = None) -> Callable[..., tuple]:
    def rule(path: str, m: nn.Module, x: Any) -> tuple:
        if one_d is not None:
            with contextlib.suppress(Reject):
                return one_d(path, m, x)
        if getattr(m, "return_indices", False):
            raise Reject
        geometry = {k: getattr(m, k) for k in POOL_DEFAULTS if hasattr(m, k)}
        op, attrs = _pool_nd(mode, dims, m.kernel_size, **geometry)
        return op, (x,), attrs
    return rule


def _f_pool(mode: str, dims: int, one_d: Spec | None = None) -> Spec:
    def spec(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, *rest: Any, **kwargs: Any) -> tuple:
        if one_d is not None:
            with contextlib.suppress(Reject):
                return one_d(input, kernel_size, stride, padding, *rest, **kwargs)
        names = ("dilation", "ceil_mode", "return_indices") if mode == "max" else (
            "ceil_mode", "count_include_pad", "divisor_override")
        geometry = {**dict(zip(names, rest)), **kwargs, "stride": stride, "padding": padding}
        if geometry.pop("return_indices", False) or set(geometry) - set(POOL_DEFAULTS):
            raise Reject
        op, attrs = _pool_nd(mode, dims, kernel_size, **geometry)
        return op, (input,), attrs
    return spec


def _ones(size: Any, dims: int) -> bool:
    return size == 1 or (isinstance(size, (tuple, list)) and len(size) == dims and all(s == 1 for s in size))


def _module_adaptive_avg(dims: int) -> Callable[..., tuple]:
    def rule(path: str, m: nn.Module, x: Any) -> tuple:
        if not _ones(m.output_size, dims):
            raise Reject
        return "mean_dims", (x,), {"dims": tuple(range(2, 2 + dims)), "keepdim": True}
    return rule


def _f_adaptive_avg(dims: int) -> Spec:
    def spec(input: Any, output_size: Any) -> tuple:
        if not _ones(output_size, dims):
            raise Reject
        return "mean_dims", (input,), {"dims": tuple(range(2, 2 + dims)), "keepdim": True}
    return spec


def _mean_dims(one_dim: Spec) -> Spec:
    """mean over one dim: `mean` as before; over several (literal ints): `mean_dims`."""
    def spec(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None, out: Any = None) -> tuple:
        if isinstance(dim, (tuple, list)) and len(dim) > 1 and _literal_ints(dim) and dtype is None and out is None:
            return "mean_dims", (input,), {"dims": tuple(dim), "keepdim": bool(keepdim)}
        return one_dim(input, dim, keepdim, dtype=dtype, out=out)
    return spec


for _d, _max, _avg in ((1, nn.MaxPool1d, nn.AvgPool1d), (2, nn.MaxPool2d, nn.AvgPool2d), (3, nn.MaxPool3d,
                                                                                         nn.AvgPool3d)):
    MODULES[_max] = _module_pool("max", _d, MODULES.get(_max))
    MODULES[_avg] = _module_pool("avg", _d, MODULES.get(_avg))
MODULES.update({nn.AdaptiveAvgPool1d: _module_adaptive_avg(1), nn.AdaptiveAvgPool2d: _module_adaptive_avg(2),
                nn.AdaptiveAvgPool3d: _module_adaptive_avg(3)})
FUNCTIONS.update({F.max_pool1d: _f_pool("max", 1, FUNCTIONS[F.max_pool1d]), F.max_pool2d: _f_pool("max", 2),
                  F.max_pool3d: _f_pool("max", 3), F.avg_pool1d: _f_pool("avg", 1, FUNCTIONS[F.avg_pool1d]),
                  F.avg_pool2d: _f_pool("avg", 2), F.avg_pool3d: _f_pool("avg", 3),
                  F.adaptive_avg_pool1d: _f_adaptive_avg(1), F.adaptive_avg_pool2d: _f_adaptive_avg(2),
                  F.adaptive_avg_pool3d: _f_adaptive_avg(3), torch.mean: _mean_dims(FUNCTIONS[torch.mean])})
METHODS["mean"] = _mean_dims(METHODS["mean"])


# ---- the trace -----------------------------------------------------------------------------------
def numeric_attributes(model: nn.Module) -> dict[float, str | None]:
    """Plain number attributes of the root module (self.multiplier = 2.0) by value; None where two
    attributes share a value, since then the literal's origin is ambiguous."""
    found: dict[float, str | None] = {}
    for name, value in vars(model).items():
        if name.startswith("_") or name == "training" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        found[value] = None if value in found else name
    return found


class _Converter:
    def __init__(self, gm: fx.GraphModule, attrs: Mapping[float, str | None]) -> None:
        self.gm = gm
        self.attrs = attrs
        self.names: dict[fx.Node, str] = {}
        self.params: dict[fx.Node, Param] = {}
        self.transposed: dict[fx.Node, Param] = {}  # W.T of a 2-d parameter W
        self.numbers: dict[fx.Node, float | int] = {}  # torch.tensor(<number>) read as the number (_number_tensor)

    def arg(self, a: Any) -> Arg:
        if isinstance(a, fx.Node):
            if a in self.params:
                return self.params[a]
            if a in self.numbers:
                return Scalar(self.numbers[a], self.attrs.get(self.numbers[a]))
            return self.names[a]
        if a is None:
            return None
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return Scalar(a, self.attrs.get(a))
        raise Reject

    def code_arg(self, a: Any) -> str:
        """How the torch fallback spells an argument: value names, self.<param>, literals."""
        if isinstance(a, fx.Node):
            if a in self.transposed:
                return f"{self.transposed[a].expr()}.T"
            if a in self.numbers:  # a CPU 0-d tensor: torch takes it beside tensors on any device
                return f"torch.tensor({self.code_arg(self.numbers[a])})"
            return self.params[a].expr() if a in self.params else self.names[a]
        if isinstance(a, (tuple, list)):
            inner = ", ".join(self.code_arg(x) for x in a)
            if isinstance(a, tuple):
                return f"({inner},)" if len(a) == 1 else f"({inner})"
            return f"[{inner}]"
        if isinstance(a, slice):
            return f"slice({self.code_arg(a.start)}, {self.code_arg(a.stop)}, {self.code_arg(a.step)})"
        if a is Ellipsis:
            return "..."
        if isinstance(a, dict):
            return "{" + ", ".join(f"{k!r}: {self.code_arg(v)}" for k, v in a.items()) + "}"
        if isinstance(a, (torch.dtype, torch.device)):
            return f"torch.{a}" if isinstance(a, torch.dtype) and not str(a).startswith("torch.") else (
                str(a) if isinstance(a, torch.dtype) else f"torch.device({str(a)!r})")
        if isinstance(a, (torch.memory_format, torch.layout)):
            return str(a)
        if isinstance(a, float) and (a != a or a in (float("inf"), float("-inf"))):
            return f"float({str(a)!r})"
        return repr(a)

    def fx_code(self, node: fx.Node) -> str:
        args = [self.code_arg(a) for a in node.args]
        kwargs = [f"{k}={self.code_arg(v)}" for k, v in node.kwargs.items()]
        if node.op == "call_module":
            return f"{attr_expr(node.target)}({', '.join(args + kwargs)})"
        if node.op == "call_method":
            return f"{args[0]}.{node.target}({', '.join(args[1:] + kwargs)})"
        if node.target is getattr and len(args) == 2 and isinstance(node.args[1], str) and node.args[1].isidentifier():
            return f"{args[0]}.{node.args[1]}"
        if getattr(node.target, "__module__", None) == "_operator":
            sym = OPERATOR_SYMBOLS.get(node.target.__name__)
            if sym and len(args) == 2:
                return f"({args[0]} {sym} {args[1]})"
            if node.target is operator.getitem:
                return f"{args[0]}[{args[1]}]"
            if node.target.__name__ in ("neg", "pos", "invert") and len(args) == 1:
                return f"({ {'neg': '-', 'pos': '+', 'invert': '~'}[node.target.__name__]}{args[0]})"
            return f"operator.{node.target.__name__}({', '.join(args)})"
        return f"{_get_qualified_name(node.target)}({', '.join(args + kwargs)})"

    def canonical(self, node: fx.Node) -> tuple[str, tuple[Arg, ...], dict[str, Any], str | None, str]:
        if node.op == "call_module":
            mod = self.gm.get_submodule(node.target)
            rule = MODULES.get(type(mod))
            torch_module = type(mod).__module__.startswith("torch.nn")
            origin = f"{'nn.' if torch_module else ''}{type(mod).__name__} {node.target}"
            if rule is None or node.kwargs or len(node.args) != 1:
                raise Reject(origin)
            try:
                op, args, attrs = rule(node.target, mod, node.args[0])
            except Reject:
                raise Reject(origin) from None  # reported by what the user wrote: "nn.AvgPool1d pool"
            return (op, tuple(a if isinstance(a, (Param, Scalar)) or a is None else self.arg(a) for a in args), attrs,
                    node.target, origin)
        if node.op == "call_function" and node.target is getattr and node.args[1] in ("T", "mT"):
            return "alias", (self.arg(node.args[0]),), {}, None, f"Tensor.{node.args[1]}"
        if node.op == "call_function":
            spec = FUNCTIONS.get(node.target)
            origin = _get_qualified_name(node.target).replace("_operator.", "operator.")
        else:
            spec, origin = METHODS.get(node.target), f"Tensor.{node.target}"
        if spec is None:
            raise Reject(origin)
        # a number tensor (_number_tensor) as its number: the spec sees `clamp(x, min=0.0)`; but torch.min(x, t) and
        # torch.max(x, t) keep the tensor (a number there would be a dim), which self.arg then reads as the number
        keep = node.target in (torch.min, torch.max)
        node_args = [a if keep or not isinstance(a, fx.Node) else self.numbers.get(a, a) for a in node.args]
        node_kwargs = {k: self.numbers.get(v, v) if isinstance(v, fx.Node) else v for k, v in node.kwargs.items()}
        try:
            op, args, attrs = spec(*node_args, **node_kwargs)
        except TypeError:
            raise Reject(origin) from None
        if op == "matmul" and args[1] in self.transposed:  # x @ W.T
            return "linear", (self.arg(args[0]), self.transposed[args[1]], None), attrs, None, origin
        if op == "matmul" and all(len(_shape(a)) >= 3 for a in args if isinstance(a, fx.Node)) and all(
                isinstance(a, fx.Node) and a not in self.params for a in args):
            attrs = {**attrs, "batched": True}  # products of matching leading dims (a broadcast stays torch)
        return op, tuple(self.arg(a) for a in args), attrs, None, origin


def _shape(node: fx.Node) -> tuple[int, ...]:
    meta = node.meta.get("tensor_meta")
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else ()


def _resolve_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _param_transpose(node: fx.Node, conv: "_Converter") -> bool:
    """`W.T` or `W.t()` of a 2-d parameter, used only as a matmul's right operand."""
    src = node.args[0] if node.args else None
    is_t = (node.op == "call_function" and node.target is getattr and len(node.args) == 2 and node.args[1] == "T") or (
        node.op == "call_method" and node.target == "t" and len(node.args) == 1)
    if not is_t or src not in conv.params or len(conv.params[src].shape) != 2:
        return False
    return all(u.op in ("call_function", "call_method")
               and u.target in (torch.matmul, operator.matmul, torch.mm, "matmul", "mm")
               and len(u.args) == 2 and u.args[1] is node for u in node.users)


def _is_host(node: fx.Node, host: set[fx.Node]) -> bool:
    """Does `node` compute a host value from sizes only: `x.size(0)`, `x.shape[1] // 2`, `len(x.shape)`?"""
    if "tensor_meta" in node.meta:
        return False
    if node.op == "call_method":
        return node.target in HOST_METHODS
    if node.op != "call_function":
        return False
    if node.target is getattr:
        return node.args[1] in HOST_ATTRS or node.args[0] in host
    module = getattr(node.target, "__module__", None)
    return module in ("_operator", "builtins", "math") and all(a in host for a in node.all_input_nodes)


def _constant_code(t: torch.Tensor) -> str:
    """Source re-making a small constant tensor the trace recorded (on the CPU, as `torch.tensor(v)` made it)."""
    if t.numel() > 64:
        raise Untraceable("Model.forward makes a large constant tensor from Python data")
    def code(v: Any) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(code(x) for x in v) + "]"
        return f"float({str(v)!r})" if isinstance(v, float) and (v != v or abs(v) == float("inf")) else repr(v)
    return f"torch.tensor({code(t.tolist())}, dtype={t.dtype})"


# Functions that take a number wherever they take a 0-d tensor, with the same result for a float tensor's
# operand: `torch.min(x, torch.tensor(0.0, device=x.device))` is `torch.min(x, 0.0)`'s clamp
NUMBER_OPERAND_FUNCTIONS = frozenset({torch.min, torch.max, torch.minimum, torch.maximum, torch.clamp, torch.add,
                                      torch.sub, torch.mul, torch.div, torch.where, operator.add, operator.sub,
                                      operator.mul, operator.truediv})


def _number_tensor(gm: fx.GraphModule, node: fx.Node) -> float | int | None:
    """The number of a 0-d floating-point tensor made from it, `torch.tensor(<number>, [dtype=...,]
    [device=x.device])` (a call where the device is a value's, else a constant the trace recorded), whose every
    use is an operand (not the first) of NUMBER_OPERAND_FUNCTIONS: it then acts as that number. None otherwise."""
    if node.op == "get_attr" and node.target.startswith("_tensor_constant"):
        t = _resolve_attr(gm, node.target)
        if not isinstance(t, torch.Tensor) or t.dim() != 0 or not t.is_floating_point():
            return None
        value = t.item()
    elif node.op == "call_function" and node.target is torch.tensor and len(node.args) == 1:
        value = node.args[0]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or set(node.kwargs) - {"dtype", "device"}:
            return None
        dtype = node.kwargs.get("dtype")
        floating = isinstance(dtype, torch.dtype) and dtype.is_floating_point
        if not (floating or dtype is None and isinstance(value, float)):
            return None
    else:
        return None
    users = list(node.users)
    if not users or any(u.op != "call_function" or u.target not in NUMBER_OPERAND_FUNCTIONS or node in u.args[:1]
                        or node in u.kwargs.values() and u.target is not torch.clamp for u in users):
        return None
    return value


def _number_tensors(gm: fx.GraphModule) -> tuple[dict[fx.Node, float | int], set[fx.Node]]:
    """The graph's number tensors (_number_tensor) and the host nodes only they read (`x.device`): both drop out
    of the captured graph, the number standing where the tensor was read."""
    numbers = {n: v for n in gm.graph.nodes if (v := _number_tensor(gm, n)) is not None}
    devices = {a for n in numbers for a in n.all_input_nodes
               if a.op == "call_function" and a.target is getattr and set(a.users) <= set(numbers)}
    return numbers, devices


def _values_of(node: fx.Node) -> bool:
    """Is this node `t[0]` or `t.values` (the values of a (values, indices) pair)?"""
    return node.op == "call_function" and (
        (node.target is operator.getitem and node.args[1] == 0)
        or (node.target is getattr and node.args[1] == "values"))


def capture(model: nn.Module, inputs: Sequence[torch.Tensor]) -> Graph:
    """Trace `model` and record every value's shape by running a copy of it (the model itself is untouched:
    a training-mode BatchNorm would otherwise update its running statistics)."""
    gm = trace(copy.deepcopy(model))
    kept = functionalize(gm)
    # ShapeProp prints a failing node's traceback itself before raising; the caller reports the failure in one line
    with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
        ShapeProp(gm).propagate(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
    conv = _Converter(gm, numeric_attributes(model))
    conv.numbers, number_devices = _number_tensors(gm)
    host: set[fx.Node] = set()
    placeholders: list[str] = []
    shapes: list[tuple[int, ...]] = []
    nodes: list[Node] = []
    outputs: tuple[str, ...] = ()
    structure = "single"
    tuple_values: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            conv.names[node] = node.name
            placeholders.append(node.name)
            shapes.append(_shape(node))
        elif _param_transpose(node, conv):  # self.weight.T / self.weight.t(): x @ W.T is linear(x, W)
            conv.transposed[node] = conv.params[node.args[0]]
        elif node in conv.numbers or node in number_devices:
            continue  # read as its number (conv.arg); `x.device` read only to make it
        elif node.op == "get_attr" and node.target.startswith("_tensor_constant"):
            # a tensor the forward made from numbers (`torch.tensor(self.c)`): made again, as written, by a torch call
            conv.names[node] = node.name
            nodes.append(Node(node.name, "unknown", (), _shape(node), origin="torch.tensor",
                              fx_code=_constant_code(_resolve_attr(gm, node.target))))
        elif node.op == "get_attr":
            value = _resolve_attr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise Untraceable(f"Model.forward reads self.{node.target}, which is not a tensor kfuse can pass on")
            conv.params[node] = Param(node.target, tuple(value.shape))
        elif node.op == "output":
            out = node.args[0]
            leaves: list[fx.Node] = []
            fx.node.map_arg(out, leaves.append)
            outputs = tuple(dict.fromkeys(conv.names[o] for o in leaves if o in conv.names))
            if isinstance(out, fx.Node) and out in conv.names:
                structure = "single"
            elif isinstance(out, (tuple, list)) and all(isinstance(o, fx.Node) and o in conv.names for o in out) \
                    and len(set(out)) == len(out):
                structure = "tuple" if isinstance(out, tuple) else "list"
            else:  # nested, repeated, constants or parameters: returned as the expression the forward wrote
                structure = conv.code_arg(out)
        else:
            conv.names[node] = node.name
            code = conv.fx_code(node)
            shape = _shape(node)
            try:
                if node in kept:  # an in-place write into an input: the caller sees it, so it runs as written
                    raise Reject(code)
                if _is_host(node, host):
                    host.add(node)
                    op, args, attrs, module, origin = "shape", tuple(
                        conv.names[a] for a in node.all_input_nodes if a in conv.names), {}, None, code
                elif node in tuple_values:  # max(x, dim)[0] / .values: the values of a captured max/min
                    op, args, attrs, module, origin = "view", (conv.names[node.args[0]],), {}, None, code
                    code = conv.names[node.args[0]]
                else:
                    op, args, attrs, module, origin = conv.canonical(node)
                if (op == "view" and node.target != "detach" and isinstance(args[0], str)
                        and shape == _shape(node.args[0])):
                    op = "identity"  # a view to the same shape (detach stays a view: it stops gradients)
                if attrs.get("tuple"):  # torch.max(x, dim): (values, indices); fused only when just values are read
                    if not all(_values_of(u) for u in node.users):
                        raise Reject(origin)
                    tuple_values.update(node.users)
                    attrs = {k: v for k, v in attrs.items() if k != "tuple"}
                    shape = tuple(node.meta["tensor_meta"][0].shape)
                    code = f"torch.{op}({args[0]}, dim={attrs['dim']}, keepdim={attrs['keepdim']})"
            except Reject as rej:
                op, args, attrs, module = "unknown", tuple(
                    conv.names[a] for a in node.all_input_nodes if a in conv.names), {}, None
                origin = rej.args[0] if rej.args else code
            nodes.append(Node(node.name, op, args, shape, attrs, module, origin, code))
    return Graph(tuple(placeholders), tuple(shapes), tuple(nodes), outputs, structure)


def capture_with_modes(model: nn.Module, inputs: Sequence[torch.Tensor]) -> Graph:
    """capture(), where each F.dropout whose `training` argument follows the model's mode
    (`F.dropout(x, p, training=self.training)`) is marked as doing so. Tracing sees only the bool, so the
    model is captured again in the other mode: a flag that flips with it follows the mode, one that does not
    is a literal (F.dropout(x, p) is active in eval mode too)."""
    g = capture(model, inputs)
    functional = [n for n in g if n.op == "dropout" and n.module is None and n.attrs.get("p", 0.0) > 0]
    if not functional:
        return g
    flipped = copy.deepcopy(model).train(not model.training)
    other = {n.name: n for n in capture(flipped, inputs)}
    nodes = []
    for n in g:
        twin = other.get(n.name)
        if (n in functional and twin is not None and twin.op == "dropout"
                and twin.attrs.get("training") != n.attrs["training"]):
            n = n.with_(attrs={"p": n.attrs["p"], "training": "self.training", "captured_training": model.training},
                        fx_code=f"torch.nn.functional.dropout({n.args[0]}, p={n.attrs['p']!r}, training=self.training)")
        nodes.append(n)
    return g.with_nodes(nodes)
