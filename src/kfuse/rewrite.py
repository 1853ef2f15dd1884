"""Stage 3, rewrite: exact algebraic rewrites, as a list of named rules.

Each rule is (name, match, replace): `match(node, graph)` says whether it applies, `replace(node, graph)`
returns the replacement node with the same name (so users need no rewiring). Only rewrites that are exact
in real arithmetic belong here; the verify stage still checks the result against the contract.
The names of the rules that fired are listed in the report.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kfuse.ir import Graph, Node, Param, Scalar
from kfuse.ops import POINTWISE, REDUCE_OPS


@dataclass(frozen=True)
class Rule:
    name: str
    doc: str
    match: Callable[[Node, Graph], bool]
    replace: Callable[[Node, Graph], Node | list[Node]]


def _is_literal(a: object) -> bool:
    return isinstance(a, Scalar) and a.attr is None


def _self_add(n: Node, g: Graph) -> bool:
    return n.op == "add" and len(n.args) == 2 and isinstance(n.args[0], str) and n.args[0] == n.args[1]


def _literal_operand(n: Node, ops: tuple[str, ...]) -> bool:
    return n.op in ops and len(n.args) == 2 and isinstance(n.args[0], str) and _is_literal(n.args[1])


def _scalar_chain(ops: tuple[str, ...]) -> Callable[[Node, Graph], bool]:
    """op(op'(v, c1), c2) with literal constants, both ops in `ops`, the inner value used only here."""
    def match(n: Node, g: Graph) -> bool:
        if not _literal_operand(n, ops) or n.args[0] in g.inputs:
            return False
        inner = g.node(n.args[0])
        return _literal_operand(inner, ops) and g.use_count(inner.name) == 1
    return match


def _fold_mul(n: Node, g: Graph) -> Node:
    """(v * c1) * c2, (v / c1) * c2, (v * c1) / c2, (v / c1) / c2 -> v * c, c = the product of the factors."""
    inner = g.node(n.args[0])
    c1 = inner.args[1].value if inner.op == "mul" else 1.0 / inner.args[1].value
    c2 = n.args[1].value if n.op == "mul" else 1.0 / n.args[1].value
    return n.with_(op="mul", args=(inner.args[0], Scalar(c1 * c2)), origin=f"{inner.origin} * {n.origin}")


def _fold_add(n: Node, g: Graph) -> Node:
    """(v + c1) + c2, (v - c1) + c2, ... -> v + c, c = the signed sum of the constants."""
    inner = g.node(n.args[0])
    c1 = inner.args[1].value if inner.op == "add" else -inner.args[1].value
    c2 = n.args[1].value if n.op == "add" else -n.args[1].value
    return n.with_(op="add", args=(inner.args[0], Scalar(c1 + c2)), origin=f"{inner.origin} + {n.origin}")


def _over_size_one(n: Node, g: Graph) -> bool:
    """A reduction or softmax over a dimension of size 1."""
    if n.op not in REDUCE_OPS + ("softmax", "log_softmax") or not isinstance(n.args[0], str):
        return False
    shape = g.shape_of(n.args[0])
    dim = n.attrs.get("dim")
    return isinstance(dim, int) and -len(shape) <= dim < len(shape) and shape[dim] == 1


def _reduce_identity(n: Node, g: Graph) -> Node:
    """sum/mean/max/min/logsumexp of one element is that element: a view (squeezed unless keepdim)."""
    x, dim = n.args[0], n.attrs["dim"]
    if n.op in ("softmax", "log_softmax"):  # softmax of one element is 1, log_softmax 0: clamp to [c, c]
        c = Scalar(1.0 if n.op == "softmax" else 0.0)
        return n.with_(op="hardtanh", args=(x, c, c), attrs={},
                       fx_code=POINTWISE["hardtanh"].torch_code(x, c.expr(), c.expr()))
    code = x if n.attrs.get("keepdim") else f"{x}.squeeze({dim})"
    return n.with_(op="view", attrs={}, fx_code=code)


def _scaled_sum(n: Node, g: Graph) -> bool:
    """sum/mean over a dim of (v * c) or (v / c), c a number, the product read only here."""
    if n.op not in ("sum", "mean") or not isinstance(n.args[0], str) or n.args[0] in g.inputs:
        return False
    inner = g.node(n.args[0])
    return (inner.op in ("mul", "div") and isinstance(inner.args[0], str) and isinstance(inner.args[1], Scalar)
            and g.use_count(inner.name) == 1)


def _sum_then_scale(n: Node, g: Graph) -> list[Node]:
    """sum(v * c) = sum(v) * c (linearity): the sum moves next to what produced v (a GEMM: then a GEMV)."""
    inner = g.node(n.args[0])
    v, c = inner.args
    dim, keep = n.attrs["dim"], n.attrs.get("keepdim", False)
    total = n.with_(name=f"{n.name}_unscaled", args=(v,), fx_code=f"torch.{n.op}({v}, dim={dim}, keepdim={keep})")
    scale = n.with_(op=inner.op, args=(total.name, c), attrs={}, module=None,
                    origin=f"{n.origin} ({inner.origin} after it)",
                    fx_code=POINTWISE[inner.op].torch_code(total.name, c.expr()))
    return [total, scale]


SOFTMAX_ROWS = {"softmax": "softmax_rows", "log_softmax": "log_softmax_rows"}


def flattened_dims(shape: tuple[int, ...], of: tuple[int, ...]) -> int | None:
    """k when a view of a value shaped `of` to `shape` ends in its last k dims flattened (1 <= k < rank): its last
    dim's groups are then the value's rows of trailing elements, in the same order."""
    if not shape or not of or math.prod(shape) != math.prod(of):
        return None
    return next((k for k in range(1, len(of)) if math.prod(of[-k:]) == shape[-1]), None)


def _softmax_over_view(n: Node, g: Graph) -> bool:
    """view(softmax(view(x, (..., L)), last dim), x's shape), L the product of x's last k >= 2 dims, each inner
    value read only by the next."""
    if n.op != "view" or not isinstance(n.args[0], str) or n.args[0] in g.inputs:
        return False
    s = g.node(n.args[0])
    if s.op not in SOFTMAX_ROWS or s.attrs.get("dim") not in (-1, len(s.shape) - 1) or g.use_count(s.name) != 1:
        return False
    if not isinstance(s.args[0], str) or s.args[0] in g.inputs:
        return False
    v = g.node(s.args[0])
    if v.op != "view" or not isinstance(v.args[0], str) or g.use_count(v.name) != 1:
        return False
    x = g.shape_of(v.args[0])
    return n.shape == x and (flattened_dims(v.shape, x) or 0) >= 2  # over one dim the softmax needs no views


def _softmax_rows(n: Node, g: Graph) -> Node:
    """One node: the softmax over rows of x's last k dims, spelled in torch by flatten and view."""
    s = g.node(n.args[0])
    v = g.node(s.args[0])
    x = v.args[0]
    k = flattened_dims(v.shape, g.shape_of(x))
    return n.with_(op=SOFTMAX_ROWS[s.op], args=(x,), attrs={"dims": k}, module=None,
                   origin=f"{v.origin}, {s.origin}, {n.origin}",
                   fx_code=f"torch.{s.op}({x}.flatten(-{k}), -1).view({x}.shape)")


# ops whose output a mean over its channels and spatial dims is split after: the conv kinds take a spatial mean of
# these (kfuse/regions: a conv's pool kind, a norm kind's finalize) but no reduction over the channels with it
SPATIAL_MEAN_OF = ("conv", "conv_transpose", "group_norm", "instance_norm", "batch_norm")


def _mean_over_channels_and_space(n: Node, g: Graph) -> bool:
    """x.mean(dims) over dim 1 and every spatial dim of a conv's or a norm's (N, C, ...) output."""
    if n.op != "mean_dims" or not isinstance(n.args[0], str) or n.args[0] in g.inputs:
        return False
    rank = len(g.shape_of(n.args[0]))
    dims = n.attrs.get("dims", ())
    return (rank >= 3 and g.node(n.args[0]).op in SPATIAL_MEAN_OF and all(isinstance(d, int) for d in dims)
            and sorted(d % rank for d in dims) == list(range(1, rank)))


def _spatial_then_channels(n: Node, g: Graph) -> list[Node]:
    """mean over (C, spatial) = mean over C of the means over the spatial dims: every channel has as many pixels."""
    x = n.args[0]
    rank, keep = len(g.shape_of(x)), bool(n.attrs.get("keepdim"))
    space = tuple(range(2, rank))
    shape = g.shape_of(x)[:2] + ((1,) * len(space) if keep else ())
    spatial = n.with_(name=f"{n.name}_spatial", args=(x,), shape=shape, attrs={"dims": space, "keepdim": keep},
                      fx_code=f"torch.mean({x}, dim={space}, keepdim={keep})")
    channels = n.with_(op="mean", args=(spatial.name,), attrs={"dim": 1, "keepdim": keep},
                       fx_code=f"torch.mean({spatial.name}, dim=1, keepdim={keep})")
    return [spatial, channels]


def _tanh_softplus_of(name: object, g: Graph) -> str | None:
    """x where `name` is tanh(softplus(x)) at softplus's defaults (beta 1, threshold 20), each used only here."""
    if not isinstance(name, str) or name in g.inputs or g.use_count(name) != 1:
        return None
    t = g.node(name)
    if t.op != "tanh" or not isinstance(t.args[0], str) or t.args[0] in g.inputs or g.use_count(t.args[0]) != 1:
        return None
    s = g.node(t.args[0])
    beta, threshold = s.args[1:] if s.op == "softplus" else (None, None)
    ok = (_is_literal(beta) and beta.value == 1.0 and _is_literal(threshold) and threshold.value == 20.0
          and isinstance(s.args[0], str))
    return s.args[0] if ok else None


def _mish_product(n: Node, g: Graph) -> bool:
    """x * tanh(softplus(x)), either order (Mish written out)."""
    if n.op != "mul" or len(n.args) != 2:
        return False
    a, b = n.args
    return _tanh_softplus_of(a, g) == b or _tanh_softplus_of(b, g) == a


def _mish(n: Node, g: Graph) -> Node:
    """One mish node: ops.py's mish is x * n / (n + 2), n = e^x (e^x + 2): one exp and a division, where the written
    form runs softplus's exp, log and divisions and then tanh's (and keeps their whole-tile temporaries live: on
    sm_90 KernelBench level 2 52's eval kernel spilled 1092 bytes at 128 x 64)."""
    a, b = n.args
    x = b if _tanh_softplus_of(a, g) == b else a
    return n.with_(op="mish", args=(x,), attrs={}, module=None, fx_code=f"torch.nn.functional.mish({x})")


def _dropout_p0(n: Node, g: Graph) -> bool:
    return n.op == "dropout" and n.attrs.get("p") == 0.0 and isinstance(n.args[0], str)


def _dropout_off(n: Node, g: Graph) -> bool:
    """F.dropout(x, p, training=False), the flag a literal (not following the model's mode)."""
    return n.op == "dropout" and n.module is None and n.attrs.get("training") is False and isinstance(n.args[0], str)


def follows_mode(n: Node) -> bool:
    """A Dropout that is active in training mode and the identity in eval mode: an nn.Dropout module, or
    F.dropout(..., training=self.training) (capture.capture_with_modes)."""
    return n.op == "dropout" and (n.module is not None or n.attrs.get("training") == "self.training")


def _identity(n: Node, g: Graph) -> Node:
    return n.with_(op="view", attrs={}, module=None, fx_code=n.args[0])


def _gemm_sum(n: Node, g: Graph) -> bool:
    """sum/mean over the features of a Linear (or x @ W) whose output nothing else reads."""
    if n.op not in ("sum", "mean") or not isinstance(n.args[0], str) or n.args[0] in g.inputs:
        return False
    lin = g.node(n.args[0])
    if lin.op not in ("linear", "matmul") or g.use_count(lin.name) != 1 or not isinstance(lin.args[0], str):
        return False
    w = lin.args[1]
    bias = lin.args[2] if lin.op == "linear" and len(lin.args) > 2 else None
    dim = n.attrs.get("dim")
    return (isinstance(w, Param) and len(w.shape) == 2 and (bias is None or isinstance(bias, Param))
            and isinstance(dim, int) and dim in (-1, len(lin.shape) - 1))


def _gemv(n: Node, g: Graph) -> Node:
    """sum_n (x W^T + b)[m, n] = x[m, :] . (sum_n W[n, :]) + sum_n b[n]: a GEMV against the summed weight rows."""
    lin = g.node(n.args[0])
    x, w = lin.args[0], lin.args[1]
    kn = lin.op == "matmul"
    bias = lin.args[2] if lin.op == "linear" and len(lin.args) > 2 else None
    code = f"torch.matmul({x}, {w.expr()}.sum({1 if kn else 0}))"
    if bias is not None:
        code += f" + {bias.expr()}.sum()"
    if n.op == "mean":
        code = f"({code}) / {w.expr()}.shape[{1 if kn else 0}]"
    if n.attrs.get("keepdim"):
        code = f"({code}).unsqueeze(-1)"
    attrs = {"keepdim": bool(n.attrs.get("keepdim")), "mean": n.op == "mean", "kn": kn}
    return n.with_(op="linear_rowsum", args=(x, w, bias), attrs=attrs, origin=f"{lin.origin} -> {n.origin}",
                   fx_code=code)


SKINNY_ROWS = 16  # at most this many rows: the GEMM runs the float64 split-K pass (kernels/gemm_core.SKINNY_M)


def _matvec(n: Node, g: Graph) -> bool:
    """A @ v of two values, A (M, K) with more than SKINNY_ROWS rows, v (K,) or (K, 1)."""
    if n.op != "matmul" or not all(isinstance(a, str) for a in n.args):
        return False
    a_shape, v_shape = g.shape_of(n.args[0]), g.shape_of(n.args[1])
    return (len(a_shape) == 2 and a_shape[0] > SKINNY_ROWS and v_shape in ((a_shape[1],), (a_shape[1], 1))
            and a_shape[1] > 0)


def _vector_matrix(n: Node, g: Graph) -> list[Node]:
    """A @ v = (v^T A^T)^T: one row against A in nn.Linear's (M, K) layout, so the GEMM is a skinny one (a read of
    A, summed in float64) rather than a tile of which all but one column would be wasted."""
    a, v = n.args
    m = g.shape_of(a)[0]
    row, out = f"{n.name}_row", f"{n.name}_t"
    return [Node(row, "alias", (v,), (1, g.shape_of(v)[0]), origin=n.origin, fx_code=f"{v}.reshape(1, -1)"),
            Node(out, "linear", (row, a, None), (1, m), origin=n.origin,
                 fx_code=f"torch.nn.functional.linear({row}, {a})"),  # a torch call where no GEMM kind takes it
            n.with_(op="alias", args=(out,), attrs={},
                    fx_code=f"{out}.reshape({'-1' if len(n.shape) == 1 else '-1, 1'})")]


RULES: list[Rule] = [
    Rule("x+x->2x", "x + x is 2 * x exactly (doubling is exact in binary floating point)",
         _self_add, lambda n, g: n.with_(op="mul", args=(n.args[0], Scalar(2.0)))),
    Rule("fold-scalar-mul", "(x * c1) * c2 -> x * (c1 * c2) for literal constants (also / c)",
         _scalar_chain(("mul", "div")), _fold_mul),
    Rule("fold-scalar-add", "(x + c1) - c2 -> x + (c1 - c2) for literal constants",
         _scalar_chain(("add", "sub")), _fold_add),
    Rule("reduce-size-1", "a reduction over a dimension of size 1 is the identity (softmax: 1, log_softmax: 0)",
         _over_size_one, _reduce_identity),
    Rule("softmax-rows", "softmax over the last dim of a view flattening x's trailing dims, viewed back: the softmax "
         "over each row of x's trailing elements (the same values in the same order)",
         _softmax_over_view, _softmax_rows),
    Rule("mean-space-then-channels", "a mean over the channels and every spatial dim of a conv's or norm's output is "
         "the mean over the channels of the means over the spatial dims (equal counts): the conv kinds fuse the "
         "spatial mean", _mean_over_channels_and_space, _spatial_then_channels),
    Rule("mish", "x * tanh(softplus(x)) at softplus's defaults is mish(x) (torch's own definition; past the threshold "
         "both are x)", _mish_product, _mish),
    Rule("dropout-p0", "Dropout with p = 0 is the identity in training and eval mode",
         _dropout_p0, _identity),
    Rule("dropout-off", "F.dropout(x, p, training=False) is the identity", _dropout_off, _identity),
    Rule("scale-after-sum", "sum(x * c) -> sum(x) * c (also mean, and / c): linearity",
         _scaled_sum, _sum_then_scale),
    Rule("sum-of-gemm->gemv", "sum over the features of x @ W^T + b = x @ (sum of W's rows) + sum(b)",
         _gemm_sum, _gemv),
    Rule("matvec->skinny", "A @ v = (v^T A^T)^T: a single row against A, the skinny GEMM",
         _matvec, _vector_matrix),
]

# Applied only for the forward ModelNew runs while every mode-following Dropout is in eval mode (modes.py).
EVAL_RULES: list[Rule] = [
    Rule("dropout-eval", "Dropout is the identity in eval mode (the forward ModelNew runs in eval mode)",
         lambda n, g: follows_mode(n) and isinstance(n.args[0], str), _identity),
]


def _drop_dead(g: Graph) -> Graph:
    """Remove nodes nothing uses any more (left behind by folds), keeping unknown ops (they may have effects)."""
    nodes = list(g.nodes)
    changed = True
    while changed:
        changed = False
        live = {a for n in nodes for a in n.value_args()} | set(g.outputs)
        # unknown ops may have effects; host values (sizes) may be read by a torch call's own spelling
        keep = [n for n in nodes if n.name in live or n.op in ("unknown", "shape")]
        changed = len(keep) != len(nodes)
        nodes = keep
    return g.with_nodes(nodes)


def rewrite(g: Graph, rules: list[Rule] = RULES) -> tuple[Graph, list[str]]:
    """Apply the rules until none fires; return the new graph and the names of the rules applied."""
    applied: list[str] = []
    progress = True
    while progress:
        progress = False
        for i, node in enumerate(g.nodes):
            rule = next((r for r in rules if r.match(node, g)), None)
            if rule is not None:
                nodes = list(g.nodes)
                # fx_code no longer matches: a torch fallback of this node is emitted from the op table
                new = rule.replace(node, g)
                # a rule that spells its result in torch sets fx_code; otherwise the original call no longer
                # matches and a torch fallback of this node is emitted from the op table. A rule may return
                # several nodes: the last one keeps the replaced node's name.
                new = new if isinstance(new, list) else [new]
                new = [m.with_(fx_code="") if m.fx_code == node.fx_code else m for m in new]
                nodes[i:i + 1] = new
                g = _drop_dead(g.with_nodes(nodes))
                applied.append(rule.name)
                progress = True
                break
    return g, applied
