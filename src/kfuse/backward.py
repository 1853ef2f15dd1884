"""Training support for ModelNew: one generated torch.autograd.Function per fused region.

`with_autograd` takes a region's code (kernels, launcher, forward lines) and returns it with a Function class
added and the forward lines replaced by one call of it:

    mul_leaky = fused_linear_mul_leaky_relu(x, self.gemm.weight, ...)          # before: no gradients
    mul_leaky = autograd_fn(LinearMulLeakyReluFn).run(self, x)                  # after

The class (a spec with no base: kernels/backward.py's autograd_fn makes it a Function) carries, spelled from the
region's nodes:
  launch     the region's original forward lines (the fused launcher): what runs when no gradient is needed
             and inside the Function's forward;
  params     every parameter the region reads (a Linear's weight and bias, scale vectors, norm affines);
  state      BatchNorm's statistics as this call used them (batch or running), so backward matches forward;
  reference  the region in plain torch, from each node's op (the same table the fallback uses), norms
             spelled functionally so recomputing never updates running statistics again;
  gemm, epilogue (GEMM-anchored regions): W and b, and the ops after the GEMM from its output z, so the
             backward GEMMs run as kernels (dX = dZ W, dW = dZ^T X) and only the epilogue is torch.
Region kinds this module does not know are still covered: any node without a spelling here falls back to
its original torch call (`fx_code`), which is correct for stateless ops (LayerNorm, pooling, reductions).
A node that has neither (or is stateful, like Dropout) gets a backward that raises a clear error.
"""

from __future__ import annotations

import dataclasses

from kfuse.ir import Arg, Graph, Node, Param, Region, Scalar, attr_expr
from kfuse.ops import CONV_OPS, POINTWISE, TRANSPOSED_GEOMETRY, conv_geometry_code
from kfuse.regions import kind_of
from kfuse.regions.common import RegionCode, docstring
from kfuse.regions.pointwise_dz import dz_method

STATEFUL = ("dropout",)  # recomputing these would not reproduce the forward (a new mask)
REDUCTIONS = ("sum", "mean", "amax", "amin", "logsumexp")  # over one dim (attrs dim, keepdim)
VIEWS = ("view",)


def region_inputs(region: Region) -> list[str]:
    """Values the region reads that it does not compute, in order of first use."""
    inside = {n.name for n in region.nodes}
    return list(dict.fromkeys(a for n in region.nodes for a in n.value_args() if a not in inside))


def _code(a: Arg, cast: bool = False) -> str:
    if isinstance(a, Param):
        return f"cast({a.expr()})" if cast else a.expr()
    if isinstance(a, Scalar):
        return a.expr()
    return "None" if a is None else a


def op_spelling(n: Node) -> str | None:
    """A torch expression computing `n` from its canonical op: value names, parameters as
    `cast(self.<param>)` (backward may work in float64: `cast` converts, differentiably), scalars, and the
    `fwd_state` dict. None for ops this table does not know."""
    args = [_code(a, cast=True) for a in n.args]
    if n.op in POINTWISE and len(args) == POINTWISE[n.op].arity:
        return POINTWISE[n.op].torch_code(*args)
    if n.op == "linear":
        x, w, *b = args
        return f"torch.nn.functional.linear({x}, {w}, {b[0] if b else 'None'})"
    if n.op == "matmul":
        return f"torch.matmul({args[0]}, {args[1]})"
    if n.op in CONV_OPS:  # in float64 where backward works in it: no TF32, whatever cuDNN's flags say
        stride, padding, dilation, groups = conv_geometry_code(n.attrs, n.module)
        return (f"torch.nn.functional.conv{n.attrs['dims']}d({args[0]}, {args[1]}, {args[2]}, {stride}, {padding}, "
                f"{dilation}, {groups})")
    if n.op == "conv_transpose":  # F.conv_transpose{1,2,3}d's order: stride, padding, output_padding, groups, dilation
        geometry = ", ".join(conv_geometry_code(n.attrs, n.module, TRANSPOSED_GEOMETRY))
        return f"torch.nn.functional.conv_transpose{n.attrs['dims']}d({args[0]}, {args[1]}, {args[2]}, {geometry})"
    if n.op == "group_norm":
        x, groups, w, b, eps = args
        return f"torch.nn.functional.group_norm({x}, int({groups}), {w}, {b}, {eps})"
    if n.op == "batch_norm" and n.module:
        return f"batch_norm_ref({args[0]}, {attr_expr(n.module)}, fwd_state[{n.module!r}], cast)"
    if n.op in REDUCTIONS and "dim" in n.attrs:
        return f"torch.{n.op}({args[0]}, dim={n.attrs['dim']}, keepdim={bool(n.attrs.get('keepdim'))})"
    if n.op in ("softmax", "log_softmax") and "dim" in n.attrs:
        return f"torch.{n.op}({args[0]}, {n.attrs['dim']})"
    if n.op == "layer_norm" and "normalized_shape" in n.attrs:
        x, w, b, eps = args
        shape = tuple(n.attrs["normalized_shape"])
        # over the last dim (what the fused row norm computes) at whatever width the model is built with
        spelled = f"({x}.shape[-1],)" if len(shape) == 1 else str(shape)
        return f"torch.nn.functional.layer_norm({x}, {spelled}, {w}, {b}, {eps})"
    if n.op == "instance_norm":  # a 2-d input is one unbatched (C, L) sample, as nn.InstanceNorm1d reads it
        x, w, b, eps = args
        return (f"torch.nn.functional.instance_norm({x}.unsqueeze(0) if {x}.dim() == 2 else {x}, None, None, {w}, "
                f"{b}, True, 0.0, {eps}).reshape({x}.shape)")
    if n.op == "linear_rowsum":  # rewrite.py's GEMV: sum_n (x W^T + b) = x . sum_n W[n] + sum(b)
        x, w, b = args
        kn = n.attrs.get("kn", False)
        code = f"torch.matmul({x}, {w}.sum({1 if kn else 0})){f' + {b}.sum()' if b != 'None' else ''}"
        if n.attrs.get("mean"):
            code = f"({code}) / {w}.shape[{1 if kn else 0}]"
        return f"({code}).unsqueeze(-1)" if n.attrs.get("keepdim") else code
    if n.op in VIEWS and n.fx_code:  # the user's own view call: sizes as written, no parameters
        return n.fx_code
    return None


def uses_fx_code(n: Node) -> bool:
    """Spelled as the user's own torch call: it reads its module's parameters as they are (no float64)."""
    return op_spelling(n) is None and bool(n.fx_code) and n.op not in STATEFUL


def spell(n: Node) -> str | None:
    """The torch expression for `n` in a reference; None if recomputing it cannot reproduce the forward."""
    return op_spelling(n) or (n.fx_code if uses_fx_code(n) else None)


def param_exprs(region: Region) -> list[str]:
    """Expressions for every tensor the region reads that can need a gradient."""
    exprs: list[str] = []
    for n in region.nodes:
        exprs += [a.expr() for a in n.args if isinstance(a, Param)]
        if n.op == "batch_norm" and n.module:
            exprs += [attr_expr(f"{n.module}.weight"), attr_expr(f"{n.module}.bias")]
        elif n.module and uses_fx_code(n):  # the module's own call: all its parameters
            exprs.append(f"*{attr_expr(n.module)}.parameters()")
    return list(dict.fromkeys(exprs))


def _returns(region: Region) -> str:
    return f"return {', '.join(region.outputs)}"


def _method(name: str, params: list[str], body: list[str]) -> list[str]:
    return ["", "    @staticmethod", f"    def {name}({', '.join(params)}):", *[f"        {ln}" for ln in body]]


def _body(nodes: list[Node], region: Region) -> list[str]:
    lines = []
    for n in nodes:
        code = spell(n)
        if code is None:
            return [f"raise NotImplementedError('kfuse: no backward for {n.origin} (op {n.op}) in a fused region')"]
        line = f"{n.name} = {code}  # {n.origin}"
        # the op's origin above its line where both would not fit a readable width (at the method's indent), and
        # a line still too wide broken after commas inside its brackets
        lines += [line] if len(line) <= BODY_WIDTH else [f"# {n.origin}", *wrap_at_commas(f"{n.name} = {code}")]
    return lines + [_returns(region)]


def reference_body(region: Region) -> list[str]:
    """A `reference` method's body: every node of the region spelled in torch, then the return of its outputs."""
    return _body(list(region.nodes), region)


BODY_WIDTH = 190  # 200 characters less the method body's indent


def wrap_at_commas(line: str, width: int = BODY_WIDTH) -> list[str]:
    """`line` as lines of at most `width` characters where it can be: broken after a ", " inside brackets (Python
    continues the statement there), continuation lines indented 4; strings are not looked into (spellings hold no
    ", " inside quotes)."""
    out, depth, start, last_break = [], 0, 0, None
    for i, ch in enumerate(line):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth > 0 and line[i + 1:i + 2] == " ":
            if i + 1 - start > width and last_break is not None:
                out.append(line[start:last_break])
                start = last_break + 1
            last_break = i + 1
    if len(line) - start > width and last_break is not None and last_break > start:
        out.append(line[start:last_break])
        start = last_break + 1
    out.append(line[start:])
    return [out[0], *[f"    {ln}" for ln in out[1:]]]


def gemm_anchored(region: Region) -> bool:
    """Can the backward GEMMs run as kernels? One input feeding a 2-d-weight GEMM that starts the region."""
    a = region.anchor
    if a.op not in ("linear", "matmul") or not isinstance(a.args[1], Param) or len(a.args[1].shape) != 2:
        return False
    bias_ok = a.op == "matmul" or len(a.args) < 3 or a.args[2] is None or isinstance(a.args[2], Param)
    return bias_ok and region_inputs(region) == [a.args[0]]


def class_name(stem: str, taken: set[str]) -> str:
    name = "".join(w.capitalize() for w in stem.split("_") if w) + "Fn"
    base, i = name, 2
    while name in taken:
        name, i = f"{base}{i}", i + 1
    taken.add(name)
    return name


def function_class(region: Region, code: RegionCode, name: str, launcher_name: str,
                   dz: tuple[str, list[str], list[str], tuple[str, ...]] | None = None) -> str:
    """The Function class source. dz: (kernel stem, parameter and scalar expressions, extra epilogue_dz
    arguments) of the generated epilogue-backward kernel of the region's kind (its `dz_plan`), which then
    computes dZ instead of torch."""
    inputs = region_inputs(region)
    gemm = gemm_anchored(region)
    replaced = " -> ".join(n.origin for n in region.nodes)
    epi = ("dZ by the generated epilogue-backward kernel" if dz else
           "the ops after the GEMM differentiated in torch")
    how = (f"z saved by the forward kernel (else recomputed) and dX = dZ W, dW = dZ^T X by gemm_nt; {epi}"
           if gemm else "the region recomputed in torch and differentiated")
    lines = [f"class {name}:", docstring(f"Autograd for {launcher_name} ({replaced}), made a Function by autograd_fn. "
                                         f"Forward: the fused kernels. Backward: {how}.")]
    if gemm:
        lines += ["", "    GEMM = True  # autograd_fn's base: FusedGemmFn"]
    if gemm and region.anchor.op == "matmul":
        lines += ["", "    KN = True  # x @ W, W (K, N)"]
    if any(uses_fx_code(n) for n in region.nodes):
        lines += ["", "    PRECISE = False  # original torch calls read their module's parameters: no float64"]
    lines += _method("launch", ["self", *inputs], [*code.forward, _returns(region)])
    if gemm and code.z_forward:
        outs = ", ".join(region.outputs) + ("," if len(region.outputs) == 1 else "")
        lines += _method("launch_z", ["self", *inputs], [*code.z_forward, f"return ({outs}), kept"])
    params = param_exprs(region)
    lines += _method("params", ["self"], [f"return ({', '.join(params)}{',' if len(params) == 1 else ''})"])
    bns = [n.module for n in region.nodes if n.op == "batch_norm" and n.module]
    if bns:
        states = ", ".join(f"{m!r}: batch_norm_state({attr_expr(m)})" for m in bns)
        lines += _method("state", ["self"], ["return {" + states + "}"])
    lines += _method("reference", ["self", "fwd_state", "cast", *inputs], _body(list(region.nodes), region))
    if gemm:
        a = region.anchor
        bias = _code(a.args[2]) if a.op == "linear" and len(a.args) > 2 else "None"
        lines += _method("gemm", ["self"], [f"return {_code(a.args[1])}, {bias}"])
        lines += _method("epilogue", ["self", "fwd_state", "cast", a.name], _body(list(region.nodes[1:]), region))
        if dz:
            lines += dz_method(*dz)
    return "\n".join(lines) + "\n"


def with_autograd(region: Region, g: Graph, code: RegionCode, stem: str, taken: set[str]) -> RegionCode:
    """The region's code with its Function class appended to the launcher and its forward lines calling it.
    `stem`: the region's name stem (its launcher is `fused_<stem>`). Regions that are not fused are plain torch
    calls: autograd already flows through them."""
    if not region.fused or not code.forward:
        return code
    name = class_name(stem, taken)
    kernels, dz = code.kernels, None
    plan = kind_of(region.kind).dz_plan(region, stem) if gemm_anchored(region) else None
    if plan is not None:  # the kind's generated epilogue-backward kernel computes dZ
        src, *how = plan
        kernels, dz = (*kernels, src), (stem, *how)
    cls = function_class(region, code, name, f"fused_{stem}", dz)
    call = f"{', '.join(region.outputs)} = autograd_fn({name}).run({', '.join(['self', *region_inputs(region)])})"
    launcher = code.launcher.rstrip("\n") + "\n\n\n" + cls if code.launcher else cls
    return dataclasses.replace(code, kernels=kernels, launcher=launcher, forward=(call,))
