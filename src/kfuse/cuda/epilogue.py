"""The CUDA code of the plain GEMM epilogue kind, and the pieces every CUDA GEMM region's code shares.

A region becomes: its functor struct(s) and CUDA launcher `kf_launch_<stem>` (CUDA_SRC), the C++ function
`kf_<stem>` bound to Python (CPP_SRC), the Python launcher `fused_<stem>` and its autograd Function (a CudaGemmFn
of kfuse/cuda/runtime.py), and the forward line calling it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfuse.backward import class_name, param_exprs, reference_body, region_inputs, spell
from kfuse.cuda.glue import (
    Member,
    bound_name,
    bound_opening,
    c_param,
    cpp_arg,
    cpp_param,
    inputs,
    launch_and_return,
    launcher_head,
)
from kfuse.cuda.spellings import bias_of, epilogue_struct
from kfuse.ir import Graph, Param, Region, attr_expr
from kfuse.regions.common import docstring, gemm_cost


@dataclass(frozen=True)
class CudaRegion:
    """One fused region's pieces: CUDA (epilogue struct + launcher), C++ wrapper, bound function, Python."""

    function: str
    cu: str
    cpp: str
    python: str  # launcher + Function class
    forward: tuple[str, ...]
    parts: tuple[str, ...] = ()  # the fixed CUDA parts it calls beyond the GEMM's (glue.FIXED_PARTS' names)


def _weight_expr(region: Region) -> str:
    return region.anchor.args[1].expr()


def is_product(region: Region) -> bool:
    """A product of two values (`x @ y`, y a value): y is the launcher's and the Function's second input."""
    return isinstance(region.anchor.args[1], str)


def is_batched(region: Region) -> bool:
    """A batched product x[..., M, K] @ y[..., K, N], the same leading dims: one launch of all the products."""
    return bool(region.anchor.attrs.get("batched"))


def launcher_source(region: Region, g: Graph, stem: str, members: list) -> str:
    """`fused_<stem>(x, weight, <the struct's inputs>, save_z=False)` (a product of two values: `(x, y, ...)`):
    outputs, and z with save_z."""
    inputs = [m for m in members if m.kind not in ("out", "z")]
    names = [m.name for m in inputs]
    kn = region.anchor.op == "matmul"
    product = is_product(region)
    second = "y" if product else "weight"
    n_out = len(region.outputs)
    ret = "outs[0]" if n_out == 1 else "tuple(outs)"
    doc = (f"Fused: {', '.join(n.origin for n in region.nodes)}: the CUDA function `{bound_name(stem)}` of CUDA_SRC "
           f"(the GEMM tile with the epilogue struct Epi_{stem}). {gemm_cost(region, g)} save_z: also return z = "
           + ("x @ y (kept for backward); y is split on every call (a value: nothing to cache)." if product else
              "x W^T + b (kept for backward)."))
    if is_batched(region):
        operands = ["ops, scheme = batched_gemm_operands(ext, x, y, GEMM_SCHEME)"]
    else:
        operands = ["x2 = x.reshape(-1, x.shape[-1])",
                    f"ops, scheme = gemm_operands(ext, x2, {second}, {kn}, GEMM_SCHEME"
                    f"{', cached=False' if product else ''})"]
    body = ["ext = cuda_module()",
            "lead = x.shape[:-1]",
            *operands,
            f"got = ext.{bound_name(stem)}(*ops, scheme, {''.join(n + ', ' for n in names)}save_z)",
            "outs = [o.reshape(*lead, o.shape[-1]).to(x.dtype) for o in got]",
            "if save_z:",
            f"    return tuple(outs[:{n_out}]), outs[{n_out}]",
            f"return {ret}"]
    params = ", ".join(["x", second, *names, "save_z=False"])
    return "\n".join([f"def fused_{stem}({params}):", docstring(doc), *[f"    {ln}" for ln in body]]) + "\n"


def _method(name: str, params: list[str], body: list[str]) -> list[str]:
    return ["", "    @staticmethod", f"    def {name}({', '.join(params)}):", *[f"        {ln}" for ln in body]]


def state_method(region: Region) -> list[str]:
    """The Function's `state` where the region has BatchNorm modules: what each normalizes with at this call
    (batch_norm_state), taken before the launch updates the running statistics; none without one."""
    bns = [n.module for n in region.nodes if n.op == "batch_norm" and n.module]
    if not bns:
        return []
    states = ", ".join(f"{m!r}: batch_norm_state({attr_expr(m)})" for m in bns)
    return _method("state", ["self"], ["return {" + states + "}"])


def recompute_function_source(region: Region, stem: str, cls: str, launch: str, kernels: str = "kernel") -> str:
    """The region's CudaRecomputeFn: launch(self, x) returns `launch` (a call of fused_<stem>), backward recomputes
    the region in float64 torch (its `reference`) and differentiates it."""
    (x,) = region_inputs(region)
    params = param_exprs(region)
    replaced = " -> ".join(n.origin for n in region.nodes)
    lines = [f"class {cls}(CudaRecomputeFn):",
             docstring(f"Autograd for fused_{stem} ({replaced}). Forward: the CUDA {kernels}. Backward: the region "
                       "recomputed in float64 torch and differentiated.")]
    lines += _method("launch", ["self", "x"], [launch])
    lines += _method("params", ["self"], [f"return ({', '.join(params)}{',' if len(params) == 1 else ''})"])
    lines += state_method(region)
    lines += _method("reference", ["self", "fwd_state", "cast", x], reference_body(region))
    return "\n".join(lines) + "\n"


def function_source(region: Region, stem: str, cls: str, values: list[str]) -> str:
    """The region's autograd Function: CudaGemmFn with the launch (`fused_<stem>(x, weight, *values)`), the GEMM's
    operands and the ops after the GEMM in torch (a BatchNorm as the forward normalized: its `state`)."""
    anchor = region.anchor
    params = param_exprs(region)
    epilogue = [f"{n.name} = {spell(n)}  # {n.origin}" for n in region.nodes[1:]]
    replaced = " -> ".join(n.origin for n in region.nodes)
    if is_product(region):
        lines = [f"class {cls}(CudaProductFn):",
                 docstring(f"Autograd for fused_{stem} ({replaced}). Forward: the CUDA kernels, which also keep z = "
                           "x @ y. Backward: the ops after the product differentiated in float64 torch from z, then "
                           "dX and dY by fp32 torch matmuls (TF32 off).")]
        launch = f"return fused_{stem}(x, y, {''.join(v + ', ' for v in values)}save_z=save_z)"
        lines += _method("launch", ["self", "x", "y", "save_z=False"], [launch])
    else:
        bias = bias_of(anchor)
        bias_expr = bias.expr() if isinstance(bias, Param) else "None"
        lines = [f"class {cls}(CudaGemmFn):",
                 docstring(f"Autograd for fused_{stem} ({replaced}). Forward: the CUDA kernels, which also keep z = x "
                           "W^T + b. Backward: the ops after the GEMM differentiated in float64 torch from z, then dX, "
                           "dW and db by fp32 torch matmuls (TF32 off).")]
        if anchor.op == "matmul":
            lines += ["", "    KN = True  # x @ W, W (K, N)"]
        launch = f"return fused_{stem}(x, {_weight_expr(region)}, {''.join(v + ', ' for v in values)}save_z=save_z)"
        lines += _method("launch", ["self", "x", "save_z=False"], [launch])
        lines += _method("gemm", ["self"], [f"return {_weight_expr(region)}, {bias_expr}"])
    lines += _method("params", ["self"], [f"return ({', '.join(params)}{',' if len(params) == 1 else ''})"])
    lines += state_method(region)
    lines += _method("epilogue", ["self", "fwd_state", "cast", anchor.name],
                     [*epilogue, f"return {', '.join(region.outputs)}"])
    return "\n".join(lines) + "\n"


def region_code(region: Region, g: Graph, stem: str, classes: set[str]) -> CudaRegion:
    # the GEMM's operands as the forward passes them: x, and for a product of two values y (x @ x: x twice)
    if is_product(region):
        operands = list(region.anchor.args[:2])
    else:
        (x,) = region_inputs(region)
        operands = [x]
    struct = f"Epi_{stem}"
    struct_src, members = epilogue_struct(region, struct)
    cu, cpp = region_sources(stem, struct, members, is_batched(region))
    cls = class_name(stem, classes)
    values = [m.value for m in members if m.kind not in ("out", "z")]
    python = launcher_source(region, g, stem, members) + "\n\n" + function_source(region, stem, cls, values)
    forward = (f"{', '.join(region.outputs)} = {cls}.run(self, {', '.join(operands)})",)
    return CudaRegion(bound_name(stem), struct_src + "\n" + cu, cpp, python, forward)


def region_sources(stem: str, struct: str, members: list[Member], batched: bool = False) -> tuple[str, str]:
    """The CUDA launcher `kf_launch_<stem>` running the GEMM with epilogue `struct`, and the C++ function
    `kf_<stem>` (bound to Python) that checks the tensors, allocates the outputs (and z when store_z) and calls
    it; returns [out0, out1, ..., z if store_z], each (batch x M, N) (`batched`: the operands of a batched
    product)."""
    outs = [m for m in members if m.kind == "out"]
    launch = ["const KfGemmArgs& g", *[c_param(m) for m in members], "cudaStream_t stream"]
    sets = "\n".join(f"  epi.{m.name} = {m.name};" for m in members)
    cu = (f"{launcher_head(stem, launch)} {{\n  {struct} epi;\n{sets}\n  epi.N = g.N;\n"
          "  return kf_gemm(g, epi, stream);\n}\n")
    lines = bound_opening(stem, launch, [cpp_param(m) for m in inputs(members)], batched=batched)
    rows = "g.batch * g.M" if batched else "g.M"
    lines += [f"  torch::Tensor {m.name} = torch::empty({{{rows}, g.N}}, options);" for m in outs]
    lines.append(f"  torch::Tensor z = store_z ? torch::empty({{{rows}, g.N}}, options) : torch::Tensor();")
    args = [f"{m.name}.data_ptr<float>()" if m.kind == "out" else "store_z ? z.data_ptr<float>() : nullptr"
            if m.kind == "z" else cpp_arg(m) for m in members]
    return cu, "\n".join(lines + launch_and_return(stem, args, [m.name for m in outs])) + "\n"
