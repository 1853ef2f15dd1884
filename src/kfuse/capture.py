"""Stage 2, capture: torch.fx symbolic tracing -> kfuse's Graph of canonical ops.

Modules stay whole (nn.Linear, nn.GroupNorm, nn.BatchNorm1d are leaves of the trace), so a node knows the
submodule whose parameters and training flag it reads at run time. Each call form maps to a canonical op
through a spec function with the callee's signature: calling it with the traced arguments binds them the
way Python would and returns `(op, operands, attrs)`. A call with no rule, or that its rule rejects, is
kept as an `unknown` node and later emitted as the original torch call.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.node import _get_qualified_name
from torch.fx.passes.shape_prop import ShapeProp

from kfuse.errors import ProblemError
from kfuse.ir import Arg, Graph, Node, Param, Scalar

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


def _view_method(*shape: Any) -> None:
    """view/reshape with literal sizes only (the shape comes from the trace); sizes read from tensors are kept."""
    flat = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    if not all(isinstance(d, int) for d in flat):
        raise Reject


def _view(input: Any, *shape: Any) -> tuple:
    _view_method(*shape)
    return "view", (input,), {}


def _plain_view(input: Any, *args: Any, **kwargs: Any) -> tuple:
    if not all(isinstance(a, int) for a in [*args, *kwargs.values()]):
        raise Reject
    return "view", (input,), {}


FUNCTIONS: dict[Any, Spec] = {
    operator.add: _binary("add"), torch.add: _binary("add"),
    operator.sub: _binary("sub"), torch.sub: _binary("sub"), torch.rsub: _rbinary("sub"),
    operator.mul: _binary("mul"), torch.mul: _binary("mul"),
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
    F.linear: _linear, torch.matmul: _matmul, operator.matmul: _matmul, torch.mm: _matmul,
    F.group_norm: _group_norm,
    torch.sum: _reduce("sum"), torch.mean: _reduce("mean"), torch.amax: _reduce("amax"), torch.amin: _reduce("amin"),
    torch.logsumexp: _reduce("logsumexp"), torch.max: _max_dim("amax"), torch.min: _max_dim("amin"),
    torch.softmax: _softmax("softmax"), F.softmax: _softmax("softmax"),
    torch.log_softmax: _softmax("log_softmax"), F.log_softmax: _softmax("log_softmax"),
    F.layer_norm: _layer_norm, F.dropout: _dropout,
    torch.maximum: _binary("clamp_min"), torch.minimum: _binary("clamp_max"),
    torch.unsqueeze: _plain_view, torch.squeeze: _plain_view, torch.flatten: _plain_view, torch.reshape: _view,
}

METHODS: dict[str, Spec] = {
    "add": _binary("add"), "sub": _binary("sub"), "mul": _binary("mul"), "div": _binary("div"),
    "neg": _unary("neg"), "relu": _unary("relu"), "sigmoid": _unary("sigmoid"), "tanh": _unary("tanh"),
    "clamp": _clamp, "clip": _clamp, "exp": _unary("exp"), "abs": _unary("abs"),
    "matmul": _matmul, "mm": _matmul,
    "sum": _reduce("sum"), "mean": _reduce("mean"), "amax": _reduce("amax"), "amin": _reduce("amin"),
    "logsumexp": _reduce("logsumexp"), "max": _max_dim("amax"), "min": _max_dim("amin"),
    "softmax": _softmax("softmax"), "log_softmax": _softmax("log_softmax"),
    "clone": _unary("identity"), "contiguous": _unary("identity"), "detach": _plain_view,
    "unsqueeze": _plain_view, "squeeze": _plain_view, "flatten": _plain_view, "view": _view, "reshape": _view,
}


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
    nn.BatchNorm1d: _module_batch_norm,
    nn.Dropout: _module_dropout,
    nn.Softmax: _module_softmax("softmax"), nn.LogSoftmax: _module_softmax("log_softmax"),
    nn.MaxPool1d: _module_max_pool, nn.AvgPool1d: _module_avg_pool,
    nn.LayerNorm: _module_layer_norm, nn.InstanceNorm1d: _module_instance_norm, nn.Flatten: _module_flatten,
}
FUNCTIONS[F.max_pool1d] = _f_max_pool
FUNCTIONS[F.avg_pool1d] = _f_avg_pool
# ReLU6 is a Hardtanh subclass with fixed bounds; exact-type lookup keeps it apart from Hardtanh.
MODULES[nn.ReLU6] = _module_scalar("hardtanh", "min_val", "max_val")


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


def trace(model: nn.Module) -> fx.GraphModule:
    try:
        return fx.symbolic_trace(model)
    except Exception as err:  # noqa: BLE001 - data-dependent control flow, unsupported Python, ...
        raise ProblemError(f"cannot capture Model.forward with torch.fx: {type(err).__name__}: {str(err).splitlines()[0]}") from None


class _Converter:
    def __init__(self, gm: fx.GraphModule, attrs: Mapping[float, str | None]) -> None:
        self.gm = gm
        self.attrs = attrs
        self.names: dict[fx.Node, str] = {}
        self.params: dict[fx.Node, Param] = {}
        self.transposed: dict[fx.Node, Param] = {}  # W.T of a 2-d parameter W

    def arg(self, a: Any) -> Arg:
        if isinstance(a, fx.Node):
            if a in self.params:
                return self.params[a]
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
            return self.params[a].expr() if a in self.params else self.names[a]
        if isinstance(a, (tuple, list)):
            inner = ", ".join(self.code_arg(x) for x in a)
            return f"({inner},)" if isinstance(a, tuple) and len(a) == 1 else (f"({inner})" if isinstance(a, tuple) else f"[{inner}]")
        if isinstance(a, torch.dtype):
            return str(a)
        if isinstance(a, float) and (a != a or a in (float("inf"), float("-inf"))):
            return f"float({str(a)!r})"
        return repr(a)

    def fx_code(self, node: fx.Node) -> str:
        args = [self.code_arg(a) for a in node.args]
        kwargs = [f"{k}={self.code_arg(v)}" for k, v in node.kwargs.items()]
        if node.op == "call_module":
            return f"self.{node.target}({', '.join(args + kwargs)})"
        if node.op == "call_method":
            return f"{args[0]}.{node.target}({', '.join(args[1:] + kwargs)})"
        if getattr(node.target, "__module__", None) == "_operator":
            sym = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "matmul": "@", "getitem": None}.get(node.target.__name__)
            if sym and len(args) == 2:
                return f"{args[0]} {sym} {args[1]}"
            if node.target is operator.getitem:
                return f"{args[0]}[{args[1]}]"
            return f"operator.{node.target.__name__}({', '.join(args)})"
        return f"{_get_qualified_name(node.target)}({', '.join(args + kwargs)})"

    def canonical(self, node: fx.Node) -> tuple[str, tuple[Arg, ...], dict[str, Any], str | None, str]:
        if node.op == "call_module":
            mod = self.gm.get_submodule(node.target)
            rule = MODULES.get(type(mod))
            origin = f"nn.{type(mod).__name__} {node.target}"
            if rule is None or node.kwargs or len(node.args) != 1:
                raise Reject(origin)
            try:
                op, args, attrs = rule(node.target, mod, node.args[0])
            except Reject:
                raise Reject(origin) from None  # reported by what the user wrote: "nn.AvgPool1d pool"
            return op, tuple(a if isinstance(a, (Param, Scalar)) or a is None else self.arg(a) for a in args), attrs, node.target, origin
        if node.op == "call_function":
            spec, origin = FUNCTIONS.get(node.target), _get_qualified_name(node.target).replace("_operator.", "operator.")
        else:
            spec, origin = METHODS.get(node.target), f"Tensor.{node.target}"
        if spec is None:
            raise Reject(origin)
        try:
            op, args, attrs = spec(*node.args, **node.kwargs)
        except TypeError:
            raise Reject(origin) from None
        if op == "matmul" and args[1] in self.transposed:  # x @ W.T
            return "linear", (self.arg(args[0]), self.transposed[args[1]], None), attrs, None, origin
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
    return all(u.op in ("call_function", "call_method") and u.target in (torch.matmul, operator.matmul, torch.mm, "matmul", "mm")
               and len(u.args) == 2 and u.args[1] is node for u in node.users)


def _values_of(node: fx.Node) -> bool:
    """Is this node `t[0]` or `t.values` (the values of a (values, indices) pair)?"""
    return node.op == "call_function" and (
        (node.target is operator.getitem and node.args[1] == 0)
        or (node.target is getattr and node.args[1] == "values"))


def capture(model: nn.Module, inputs: Sequence[torch.Tensor]) -> Graph:
    """Trace `model` and record every value's shape by running a copy of it (the model itself is untouched:
    a training-mode BatchNorm would otherwise update its running statistics)."""
    gm = trace(copy.deepcopy(model))
    with torch.no_grad():
        ShapeProp(gm).propagate(*[t.clone() for t in inputs])
    conv = _Converter(gm, numeric_attributes(model))
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
        elif node.op == "get_attr":
            value = _resolve_attr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise ProblemError(f"Model.forward reads self.{node.target}, which is not a tensor kfuse can pass on")
            conv.params[node] = Param(node.target, tuple(value.shape))
        elif node.op == "output":
            out = node.args[0]
            if isinstance(out, (tuple, list)):
                structure = "tuple" if isinstance(out, tuple) else "list"
                outputs = tuple(conv.names[o] for o in out)
            else:
                outputs = (conv.names[out],)
        else:
            conv.names[node] = node.name
            code = conv.fx_code(node)
            shape = _shape(node)
            try:
                if node in tuple_values:  # max(x, dim)[0] / .values: the values of a captured max/min
                    op, args, attrs, module, origin = "view", (conv.names[node.args[0]],), {}, None, code
                    code = conv.names[node.args[0]]
                else:
                    op, args, attrs, module, origin = conv.canonical(node)
                if op == "view" and node.target != "detach" and isinstance(args[0], str) and shape == _shape(node.args[0]):
                    op = "identity"  # a view to the same shape (detach stays a view: it stops gradients)
                if attrs.get("tuple"):  # torch.max(x, dim): (values, indices); fused only when just values are read
                    if not all(_values_of(u) for u in node.users):
                        raise Reject(origin)
                    tuple_values.update(node.users)
                    attrs = {k: v for k, v in attrs.items() if k != "tuple"}
                    shape = tuple(node.meta["tensor_meta"][0].shape)
                    code = f"torch.{op}({args[0]}, dim={attrs['dim']}, keepdim={attrs['keepdim']})"
            except Reject as rej:
                op, args, attrs, module = "unknown", tuple(conv.names[a] for a in node.all_input_nodes if a in conv.names), {}, None
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
        if n in functional and twin is not None and twin.op == "dropout" and twin.attrs.get("training") != n.attrs["training"]:
            n = n.with_(attrs={"p": n.attrs["p"], "training": "self.training", "captured_training": model.training},
                        fx_code=f"torch.nn.functional.dropout({n.args[0]}, p={n.attrs['p']!r}, training=self.training)")
        nodes.append(n)
    return g.with_nodes(nodes)
