"""The CUDA code of the norm region kinds: GEMM -> pointwise ops -> GroupNorm or BatchNorm1d -> pointwise ops.

Two stages in one bound function `kf_<stem>` (norm_source.py has the fixed kernels):
  1. the GEMM with the ops before the norm as its epilogue functor `Pre_<stem>`, storing u (the norm's input) and
     every value before the norm that is read later (outside the region, or by an op after the norm), and z for
     backward;
  2. the norm's pass over u (kf_group_norm: per (row, group) statistics and apply in one kernel; kf_batch_norm:
     per-column statistics, then apply), calling `Post_<stem>` on each normalized element: the ops after the
     norm, reading the stored earlier values where they need them, storing the region's later outputs.
The Triton twins fuse the GroupNorm into the GEMM's tile (for groups a column tile holds whole) and BatchNorm's
partial statistics into its epilogue; here u is written once by the GEMM and read back by the norm's pass: one more
read and write of an M x N fp32 tile (GroupNorm) or one more read (BatchNorm), the price of keeping the GEMM's
epilogue per element. Autograd: CudaGemmFn, the ops after the GEMM (the norm included) recomputed in float64 torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kfuse.backward import class_name, region_inputs
from kfuse.cuda.epilogue import CudaRegion, function_source
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
from kfuse.cuda.spellings import EpilogueArgs, body_lines, chain_lines, functor_struct
from kfuse.ir import Graph, Node, Param, Region, attr_expr
from kfuse.regions.common import docstring, gemm_cost, var


@dataclass(frozen=True)
class NormPlan:
    """Where a norm region's values are computed and stored."""

    norm: Node
    pre: tuple[Node, ...]  # the ops between the GEMM and the norm
    post: tuple[Node, ...]  # the ops after the norm
    stored: tuple[str, ...]  # what the GEMM's functor stores: u first, then earlier values read later
    saved: tuple[str, ...]  # the stored values the post functor reads
    late: tuple[str, ...]  # the region's outputs computed by the norm's pass (the norm's value or later)
    outputs: tuple[str, ...]  # the region's outputs, in its order


def norm_plan(region: Region, ops: tuple[str, ...] = ("group_norm", "batch_norm")) -> NormPlan:
    """The region cut at its first op of `ops` (the norm)."""
    at = next(i for i, n in enumerate(region.nodes) if n.op in ops)
    norm, pre, post = region.nodes[at], region.nodes[1:at], region.nodes[at + 1:]
    early = {n.name for n in region.nodes[:at]}
    read_late = [a for n in post for a in n.value_args() if a in early]
    saved = tuple(dict.fromkeys(read_late))
    stored = tuple(dict.fromkeys([norm.args[0], *[v for v in region.outputs if v in early], *saved]))
    late = tuple(v for v in region.outputs if v not in early)
    return NormPlan(norm, tuple(pre), tuple(post), stored, saved, late, region.outputs)


def gemm_struct(region: Region, pre, stored, before: Node, struct: str) -> tuple[str, list[Member]]:
    """The GEMM's functor: the ops `pre` (those before the node `before`), storing `stored` (out0, out1, ...)."""
    args = EpilogueArgs()
    body = body_lines(region, args, pre, stored)
    members = [*[Member(f"out{i}", "out") for i in range(len(stored))], Member("z", "z")]
    doc = f"The GEMM's epilogue before {before.origin}: " + " -> ".join(n.origin for n in [region.anchor, *pre]) + "."
    return functor_struct(struct, doc, members, args, body), [*members, *args.members]


def post_struct(plan: NormPlan, struct: str, **where) -> tuple[str, list[Member]]:
    """The norm pass's functor: acc is the norm's output; the ops after it; stores plan.late (`where`: the element's
    `at` and `sizes`, functor_struct's, where they are not a GEMM's)."""
    args = EpilogueArgs()
    env = {plan.norm.name: var(plan.norm.name)}
    body = [f"const float {var(plan.norm.name)} = acc;  // {plan.norm.origin}"]
    for i, v in enumerate(plan.saved):
        body.append(f"const float {var(v)} = sv{i}[at];  // stored before the norm")
        env[v] = var(v)
    body += chain_lines(plan.post, env, args)
    body += [f"out{i}[at] = {env[v]};" for i, v in enumerate(plan.late)]
    members = [*[Member(f"out{i}", "out") for i in range(len(plan.late))],
               *[Member(f"sv{i}", "saved") for i in range(len(plan.saved))]]
    doc = f"After {plan.norm.origin}: " + (" -> ".join(n.origin for n in plan.post) or "its stores") + "."
    return functor_struct(struct, doc, members, args, body, **where), [*members, *args.members]


@dataclass(frozen=True)
class NormCall:
    """How one norm's pass is called: its C++ / CUDA parameters, the scratch the C++ side allocates, the call."""

    cpp_params: tuple[str, ...]  # the bound function's parameters, e.g. "int64_t groups"
    checks: tuple[str, ...]  # C++ lines checking them and allocating scratch
    cu_params: tuple[str, ...]  # the CUDA launcher's extra parameters
    cu_args: tuple[str, ...]  # ... and what the C++ side passes for them
    launch: str  # the CUDA launcher's call of the pass (u = pre.out0)
    py_params: tuple[str, ...]  # the Python launcher's parameters
    py_lines: tuple[str, ...]  # its lines before the call
    py_args: tuple[str, ...]  # what it passes to kf_<stem>
    py_after: tuple[str, ...]  # its lines after the call
    values: tuple[str, ...]  # what the Function's launch passes for py_params


def affine_vector(p) -> str:
    """An optional affine vector for the C++ side: the tensor, or an empty one (nullptr) where absent."""
    return f"as_vector({p.expr()})" if isinstance(p, Param) else "x.new_empty(0)"


def group_norm_call(norm: Node) -> NormCall:
    _x, groups, w, b, eps = norm.args
    return NormCall(
        cpp_params=("int64_t groups", "torch::Tensor gamma", "torch::Tensor beta", "double eps"),
        checks=('TORCH_CHECK(groups > 0 && g.N % groups == 0, "kfuse: GroupNorm of ", g.N, " channels in ", groups, '
                '" groups");',
                'const float* gamma_p = kf_optional_vector(gamma, g.N, "the GroupNorm\'s weight", a);',
                'const float* beta_p = kf_optional_vector(beta, g.N, "the GroupNorm\'s bias", a);'),
        cu_params=("int group", "const float* gamma", "const float* beta", "float eps"),
        cu_args=("static_cast<int>(g.N / groups)", "gamma_p", "beta_p", "static_cast<float>(eps)"),
        launch="kf_group_norm(pre.out0, g.M, g.N, group, gamma, beta, eps, post, stream)",
        py_params=("groups", "gamma", "beta", "eps"),
        py_lines=(),
        py_args=("groups", "gamma", "beta", "eps"),
        py_after=(),
        values=(f"int({groups.expr()})", affine_vector(w), affine_vector(b), f"float({eps.expr()})"),
    )


def batch_norm_call(norm: Node) -> NormCall:
    bn = attr_expr(norm.module)
    affine = norm.attrs.get("affine", True)
    gamma = f"as_vector({bn}.weight)" if affine else "x.new_empty(0)"
    beta = f"as_vector({bn}.bias)" if affine else "x.new_empty(0)"
    return NormCall(
        cpp_params=("bool batch", "torch::Tensor running_mean", "torch::Tensor running_var", "double factor",
                    "double eps", "torch::Tensor gamma", "torch::Tensor beta"),
        checks=('TORCH_CHECK(!batch || g.M > 1, "kfuse: BatchNorm: expected more than 1 value per channel when '
                'training, got input of ", g.M, " rows");',
                "const bool keeps = factor >= 0 || !batch;  // the running statistics are read or written",
                'float* rm_p = keeps ? kf_vector(running_mean, g.N, "running_mean", a) : nullptr;',
                'float* rv_p = keeps ? kf_vector(running_var, g.N, "running_var", a) : nullptr;',
                'const float* gamma_p = kf_optional_vector(gamma, g.N, "the BatchNorm\'s weight", a);',
                'const float* beta_p = kf_optional_vector(beta, g.N, "the BatchNorm\'s bias", a);',
                "const long long chunks = kf_bn_chunks(g.M, g.N);",
                "torch::Tensor part = torch::empty({batch ? 2 * chunks * g.N : 0}, options.dtype(torch::kFloat64));",
                "torch::Tensor stats = torch::empty({2, g.N}, options);"),
        cu_params=("bool batch", "double* part", "long long chunks", "float eps", "float factor",
                   "float* running_mean", "float* running_var", "float* mean", "float* rstd", "const float* gamma",
                   "const float* beta"),
        cu_args=("batch", "part.data_ptr<double>()", "chunks", "static_cast<float>(eps)",
                 "static_cast<float>(factor)", "rm_p", "rv_p", "stats.data_ptr<float>()",
                 "stats.data_ptr<float>() + g.N", "gamma_p", "beta_p"),
        launch=("kf_batch_norm(pre.out0, g.M, g.N, batch, part, chunks, eps, factor, running_mean, running_var, "
                "mean, rstd, gamma, beta, post, stream)"),
        py_params=("bn", "gamma", "beta"),
        py_lines=("batch, factor = batch_norm_mode(bn)  # torch's bookkeeping: counts the batch",
                  "none = x.new_empty(0)"),
        py_args=("batch", "bn.running_mean if bn.running_mean is not None else none",
                 "bn.running_var if bn.running_var is not None else none", "factor", "float(bn.eps)", "gamma", "beta"),
        py_after=("if factor >= 0:  # written in place by the kernel: bump the versions as torch's in-place ops do",
                  "    torch.autograd.graph.increment_version((bn.running_mean, bn.running_var))"),
        values=(bn, gamma, beta),
    )


def norm_call(norm: Node) -> NormCall:
    return group_norm_call(norm) if norm.op == "group_norm" else batch_norm_call(norm)


def launch_params(pre: list[Member], post: list[Member], call: NormCall) -> list[str]:
    return ["const KfGemmArgs& g", *[c_param(m, "e_") for m in pre], *call.cu_params, *[c_param(m, "q_") for m in post],
            "cudaStream_t stream"]


def cuda_launcher(stem: str, pre: list[Member], post: list[Member], call: NormCall) -> str:
    sets = [f"  pre.{m.name} = e_{m.name};" for m in pre] + [f"  post.{m.name} = q_{m.name};" for m in post]
    return "\n".join([launcher_head(stem, launch_params(pre, post, call)) + " {",
                      f"  Pre_{stem} pre;", f"  Post_{stem} post;", *sets, "  pre.N = post.N = g.N;",
                      "  const int err = kf_gemm(g, pre, stream);",
                      "  if (err != 0) return err;",
                      f"  return {call.launch};", "}"]) + "\n"


def cpp_function(stem: str, plan: NormPlan, pre: list[Member], post: list[Member], call: NormCall) -> str:
    """`kf_<stem>`: checks, allocations, the CUDA launcher's call; returns the outputs in region order, then z."""
    params = [*[cpp_param(m, "e_") for m in inputs(pre)], *call.cpp_params, *[cpp_param(m, "q_") for m in inputs(post)]]
    lines = [*bound_opening(stem, launch_params(pre, post, call), params, call.checks),
             f"  torch::Tensor st[{len(plan.stored)}], lt[{max(1, len(plan.late))}];",
             "  for (auto& t : st) t = torch::empty({g.M, g.N}, options);",
             f"  for (int i = 0; i < {len(plan.late)}; ++i) lt[i] = torch::empty({{g.M, g.N}}, options);",
             "  torch::Tensor z = store_z ? torch::empty({g.M, g.N}, options) : torch::Tensor();"]
    args = []
    for m in pre:
        if m.kind == "out":
            args.append(f"st[{m.name[3:]}].data_ptr<float>()")
        elif m.kind == "z":
            args.append("store_z ? z.data_ptr<float>() : nullptr")
        else:
            args.append(cpp_arg(m, "e_"))
    args += [*call.cu_args, *post_args(plan, post)]
    return "\n".join(lines + launch_and_return(stem, args, output_tensors(plan))) + "\n"


def post_args(plan: NormPlan, post: list[Member]) -> list[str]:
    """What a bound C++ function passes for the post functor's members (functor_args)."""
    return functor_args(post, plan.stored, plan.saved)


def functor_args(post: list[Member], stored: Sequence[str], saved: Sequence[str], rows: Sequence[str] = (),
                 row_read: Sequence[str] = ()) -> list[str]:
    """What a bound C++ function passes for a full-width functor's members: the tensors lt[i] of its outputs, st[i]
    of the values stored before it (`saved`, among `stored`), rt[i] of the per-row values it reads (`row_read`,
    among `rows`), the inputs (q_ parameters)."""
    args = []
    for m in post:
        if m.kind == "out":
            args.append(f"lt[{m.name[3:]}].data_ptr<float>()")
        elif m.kind == "saved":
            args.append(f"st[{stored.index(saved[int(m.name[2:])])}].data_ptr<float>()")
        elif m.kind == "row":
            args.append(f"rt[{rows.index(row_read[int(m.name[2:])])}].data_ptr<float>()")
        else:
            args.append(cpp_arg(m, "q_"))
    return args


def output_tensors(plan: NormPlan) -> list[str]:
    """The region's outputs in its order, as the st / lt tensors holding them."""
    return [f"st[{plan.stored.index(v)}]" if v in plan.stored else f"lt[{plan.late.index(v)}]" for v in plan.outputs]


def python_launcher(region: Region, g: Graph, stem: str, pre: list[Member], post: list[Member],
                    call: NormCall) -> str:
    e = [f"e_{m.name}" for m in inputs(pre)]
    q = [f"q_{m.name}" for m in inputs(post)]
    n_out = len(region.outputs)
    ret = "outs[0]" if n_out == 1 else "tuple(outs)"
    doc = (f"Fused: {', '.join(n.origin for n in region.nodes)}: the CUDA function `{bound_name(stem)}` of CUDA_SRC "
           f"(the GEMM tile with the epilogue struct Pre_{stem}, then the norm's pass over its output with "
           f"Post_{stem}). {gemm_cost(region, g)} save_z: also return z = x W^T + b (kept for backward).")
    body = ["ext = cuda_module()",
            "lead = x.shape[:-1]",
            "x2 = x.reshape(-1, x.shape[-1])",
            f"ops, scheme = gemm_operands(ext, x2, weight, {region.anchor.op == 'matmul'}, GEMM_SCHEME)",
            *call.py_lines,
            f"got = ext.{bound_name(stem)}(*ops, scheme, {', '.join([*e, *call.py_args, *q])}, save_z)",
            *call.py_after,
            "outs = [o.reshape(*lead, o.shape[-1]).to(x.dtype) for o in got]",
            "if save_z:",
            f"    return tuple(outs[:{n_out}]), outs[{n_out}]",
            f"return {ret}"]
    params = ", ".join(["x", "weight", *e, *call.py_params, *q, "save_z=False"])
    return "\n".join([f"def fused_{stem}({params}):", docstring(doc), *[f"    {ln}" for ln in body]]) + "\n"


def region_code(region: Region, g: Graph, stem: str, classes: set[str]) -> CudaRegion:
    """The CUDA pieces of a GEMM -> ... -> norm -> ... region."""
    (x,) = region_inputs(region)
    plan = norm_plan(region)
    pre_src, pre = gemm_struct(region, plan.pre, plan.stored, plan.norm, f"Pre_{stem}")
    post_src, post = post_struct(plan, f"Post_{stem}")
    call = norm_call(plan.norm)
    cu = "\n".join([pre_src, post_src, cuda_launcher(stem, pre, post, call)])
    cpp = cpp_function(stem, plan, pre, post, call)
    cls = class_name(stem, classes)
    values = [*[m.value for m in inputs(pre)], *call.values, *[m.value for m in inputs(post)]]
    python = python_launcher(region, g, stem, pre, post, call) + "\n\n" + function_source(region, stem, cls, values)
    forward = (f"{', '.join(region.outputs)} = {cls}.run(self, {x})",)
    return CudaRegion(bound_name(stem), cu, cpp, python, forward, (plan.norm.op,))  # its fixed part: glue.FIXED_PARTS
