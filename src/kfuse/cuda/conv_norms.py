"""The CUDA code of the registry's norm-after-convolution kinds: convolution -> pointwise ops -> a norm -> pointwise
ops, the norm GroupNorm or InstanceNorm (no running statistics; one channel a group; on unless
KFUSE_CUDA_CONV_NORMS=0 when a file is generated, then cuda/regions.py leaves the norm a torch call after the
convolution's region, with that reason: the A/B against it) or a BatchNorm module over the convolution's whole
output (batch statistics in training mode, updating the running ones as torch does; the running statistics in eval
mode, read when the model is called).

Two stages in one bound function `kf_<stem>`:
  1. the convolution's launches (conv.py: either tile, transposed ones too) with the ops before the norm as the
     functor `Pre_<stem>`, storing u (the norm's input) and the region's outputs before the norm;
  2. the norm's pass (conv_norm_source.py): GroupNorm, kf_conv_norm: each (sample, group)'s float64 statistics over
     its contiguous run of u, in chunks; BatchNorm, kf_conv_batch_norm: each channel's float64 statistics over its B
     P values, in chunks (or the running statistics); then the normalized value, the norm's affine and `Post_<stem>`
     (the ops after the norm, which may read u) on each element, storing the region's outputs after the norm.
The Triton twins compute the statistics from per-tile partials in the convolution's own tile; here u is written by
the convolution and read back twice. Autograd: CudaRecomputeFn, the region recomputed in float64 torch (a BatchNorm
with the statistics this call normalized with: the Function's `state`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kfuse.backward import class_name, region_inputs
from kfuse.cuda.conv import (
    AT,
    conv_launcher,
    conv_struct,
    cost_line,
    function_source,
    launch_params,
    launcher_lines,
    runs_direct,
    tile_kernels,
    two_stage_function,
)
from kfuse.cuda.epilogue import CudaRegion
from kfuse.cuda.glue import Member, bound_name, c_param, cpp_arg, cpp_param, inputs, launcher_head
from kfuse.cuda.norms import NormPlan, affine_vector, batch_norm_call, norm_plan, output_tensors, post_args, post_struct
from kfuse.ir import Graph, Node, Region

NORMS = ("group_norm", "instance_norm", "batch_norm")  # where a region of these kinds is cut (norm_plan)
SWITCH = "KFUSE_CUDA_CONV_NORMS"  # "0": the GroupNorm / InstanceNorm kind is off (when a file is generated)


def switched_on() -> bool:
    return os.environ.get(SWITCH, "1") != "0"


@dataclass(frozen=True)
class ConvNormCall:
    """How one norm's pass is called: by the bound C++ function (its parameters, checks and scratch) and by the
    Python launcher (its parameters and lines), and the CUDA pass launcher's parameters and call."""

    pass_params: tuple[str, ...]  # the pass launcher's parameters between (u, B, C, P) and the post members
    pass_call: str  # its call of the fixed pass (conv_norm_source.py)
    cpp_params: tuple[str, ...]  # the bound function's norm parameters
    checks: tuple[str, ...]  # its C++ lines checking them and allocating the statistics
    cpp_args: tuple[str, ...]  # what it passes the pass launcher for pass_params
    py_params: tuple[str, ...]  # the Python launcher's norm parameters
    py_lines: tuple[str, ...]  # its lines before the call
    py_args: tuple[str, ...]  # what it passes kf_<stem> for cpp_params
    py_after: tuple[str, ...]  # its lines after the call
    values: tuple[str, ...]  # what the Function's launch passes for py_params
    reads: str  # how often the pass reads u (the launcher's docstring)


def group_norm_call(norm: Node) -> ConvNormCall:
    """GroupNorm, or InstanceNorm as one channel a group (groups None)."""
    if norm.op == "group_norm":
        _x, groups, w, b, eps = norm.args
        values = (f"int({groups.expr()})", affine_vector(w), affine_vector(b), f"float({eps.expr()})")
    else:
        _x, w, b, eps = norm.args
        values = ("None", affine_vector(w), affine_vector(b), f"float({eps.expr()})")
    lines = ["norm_g = geo.out_shape[1] if norm_groups is None else norm_groups  # InstanceNorm: one channel a group"]
    if norm.op == "instance_norm":  # torch's F.instance_norm check
        lines += ["if torch.Size(geo.out_shape[2:]).numel() == 1:",
                  "    raise ValueError(f'Expected more than 1 spatial element when training, got input size "
                  "{tuple(geo.out_shape)}')"]
    return ConvNormCall(
        pass_params=("int group", "float eps", "const float* gamma", "const float* beta", "float* mean", "float* rstd",
                     "double* part", "long long chunks"),
        pass_call="kf_conv_norm(u, B, C, P, group, eps, gamma, beta, mean, rstd, part, chunks, post, stream)",
        cpp_params=("int64_t groups", "torch::Tensor gamma", "torch::Tensor beta", "double eps"),
        checks=('TORCH_CHECK(groups > 0 && C % groups == 0, "kfuse: GroupNorm of ", C, " channels in ", groups, '
                '" groups");',
                'const float* gamma_p = kf_optional_vector(gamma, C, "the norm\'s weight", a);',
                'const float* beta_p = kf_optional_vector(beta, C, "the norm\'s bias", a);',
                "torch::Tensor stats = torch::empty({2, B * groups}, x.options());",
                "const long long chunks = kf_conv_stat_chunks(1, B * groups, C / groups * P);",
                "torch::Tensor part = torch::empty({2 * chunks * B * groups}, x.options().dtype(torch::kFloat64));"),
        cpp_args=("static_cast<int>(C / groups)", "static_cast<float>(eps)", "gamma_p", "beta_p",
                  "stats.data_ptr<float>()", "stats.data_ptr<float>() + B * groups", "part.data_ptr<double>()",
                  "chunks"),
        py_params=("norm_groups", "gamma", "beta", "eps"),
        py_lines=tuple(lines),
        py_args=("norm_g", "gamma", "beta", "eps"),
        py_after=(),
        values=values,
        reads="twice",
    )


def batch_norm_conv_call(norm: Node) -> ConvNormCall:
    """A BatchNorm module: the Python side is the GEMM twin's (norms.batch_norm_call: the mode read at call time,
    torch's bookkeeping, the running statistics' versions bumped); the statistics are per channel over B P values."""
    gemm = batch_norm_call(norm)
    return ConvNormCall(
        pass_params=("bool batch", "double* part", "long long chunks", "float eps", "float factor",
                     "float* running_mean", "float* running_var", "float* mean", "float* rstd", "const float* gamma",
                     "const float* beta"),
        pass_call=("kf_conv_batch_norm(u, B, C, P, batch, part, chunks, eps, factor, running_mean, running_var, mean, "
                   "rstd, gamma, beta, post, stream)"),
        cpp_params=gemm.cpp_params,
        checks=('TORCH_CHECK(!batch || B * P > 1, "kfuse: BatchNorm: expected more than 1 value per channel when '
                'training, got ", B * P);',
                "const bool keeps = factor >= 0 || !batch;  // the running statistics are read or written",
                'float* rm_p = keeps ? kf_vector(running_mean, C, "running_mean", a) : nullptr;',
                'float* rv_p = keeps ? kf_vector(running_var, C, "running_var", a) : nullptr;',
                'const float* gamma_p = kf_optional_vector(gamma, C, "the BatchNorm\'s weight", a);',
                'const float* beta_p = kf_optional_vector(beta, C, "the BatchNorm\'s bias", a);',
                "const long long chunks = batch ? kf_conv_stat_chunks(B, C, P) : 0;",
                "torch::Tensor part = torch::empty({2 * chunks * C}, x.options().dtype(torch::kFloat64));",
                "torch::Tensor stats = torch::empty({2, C}, x.options());"),
        cpp_args=("batch", "part.data_ptr<double>()", "chunks", "static_cast<float>(eps)",
                  "static_cast<float>(factor)", "rm_p", "rv_p", "stats.data_ptr<float>()",
                  "stats.data_ptr<float>() + C", "gamma_p", "beta_p"),
        py_params=gemm.py_params,
        py_lines=gemm.py_lines,
        py_args=gemm.py_args,
        py_after=gemm.py_after,
        values=gemm.values,
        reads="twice",
    )


def norm_call(norm: Node) -> ConvNormCall:
    return batch_norm_conv_call(norm) if norm.op == "batch_norm" else group_norm_call(norm)


def pass_launcher(stem: str, post: list[Member], call: ConvNormCall) -> tuple[str, list[str]]:
    """`kf_launch_<stem>_norm(u, B, C, P, norm parameters..., post members..., stream)` and its parameters."""
    params = ["const float* u", "long long B", "long long C", "long long P", *call.pass_params,
              *[c_param(m) for m in post], "cudaStream_t stream"]
    sets = [f"  post.{m.name} = {m.name};" for m in post]
    return "\n".join([launcher_head(f"{stem}_norm", params) + " {", f"  Post_{stem} post;", *sets, "  post.P = P;",
                      f"  return {call.pass_call};", "}"]) + "\n", params


def cpp_function(stem: str, plan: NormPlan, pre: list[Member], post: list[Member], direct: bool,
                 norm_params: list[str], call: ConvNormCall) -> str:
    """`kf_<stem>`: the convolution's launches with Pre_<stem>, then the norm's pass; the outputs in region order."""
    params = [*[cpp_param(m, "e_") for m in inputs(pre)], *call.cpp_params, *[cpp_param(m, "q_") for m in inputs(post)]]
    pre_args = [f"st[{i}].data_ptr<float>()" for i in range(len(plan.stored))] + [cpp_arg(m, "e_")
                                                                                 for m in inputs(pre)]
    norm_args = ["st[0].data_ptr<float>()", "B", "C", "P", *call.cpp_args, *post_args(plan, post)]
    setup = ["  const KfConvArgs& g = ops.launches.front();  // C_out (g.N) for the per-channel vectors",
             "  const int64_t B = out_shape[0], C = out_shape[1], P = g.FD * g.FH * g.FW;",
             '  TORCH_CHECK(C <= 65535 && B <= 65535, "kfuse: too many channels or samples for the norm\'s pass");',
             *[f"  {c}" for c in call.checks],
             f"  torch::Tensor st[{len(plan.stored)}], lt[{max(1, len(plan.late))}];",
             "  for (auto& t : st) t = torch::empty(out_shape, x.options());",
             f"  for (int i = 0; i < {len(plan.late)}; ++i) lt[i] = torch::empty(out_shape, x.options());"]
    return two_stage_function(stem, "norm", direct, params, launch_params(pre, "e_"), norm_params, setup,
                              pre_args, norm_args, output_tensors(plan))


def python_source(region: Region, g: Graph, stem: str, cls: str, plan: NormPlan, pre: list[Member],
                  post: list[Member], call: ConvNormCall) -> str:
    """`fused_<stem>(x, weight, pre inputs..., norm parameters..., post inputs..., <geometry>)` and the region's
    CudaRecomputeFn."""
    anchor = region.anchor
    e = [f"e_{m.name}" for m in inputs(pre)]
    q = [f"q_{m.name}" for m in inputs(post)]
    geometry, head, operands = launcher_lines(anchor)
    args = ", ".join([operands, *e, *call.py_args, *q])
    body = [*head, *call.py_lines, f"got = ext.{bound_name(stem)}({args})", *call.py_after,
            f"return {'got[0]' if len(region.outputs) == 1 else 'tuple(got)'}"]
    pass_kernel = call.pass_call.split("(")[0]
    doc = (f"Fused: {', '.join(n.origin for n in region.nodes)}: the CUDA function `{bound_name(stem)}` "
           f"({tile_kernels(anchor)} with Pre_{stem}, then {pass_kernel} with Post_{stem}). {cost_line(region, g)} "
           f"Then the norm's pass: u read {call.reads}, each output written once.")
    params = ["x", "weight", *e, *call.py_params, *q, *geometry]
    values = [*[m.value for m in inputs(pre)], *call.values, *[m.value for m in inputs(post)]]
    return function_source(region, stem, cls, params, body, doc, values)


def region_code(region: Region, g: Graph, stem: str, classes: set[str]) -> CudaRegion:
    (x,) = region_inputs(region)
    plan = norm_plan(region, NORMS)
    call = norm_call(plan.norm)
    direct = runs_direct(region.anchor)
    pre_src, pre = conv_struct(region, f"Pre_{stem}", plan.pre, plan.stored)
    post_src, post = post_struct(plan, f"Post_{stem}", at=AT, sizes=("P",))
    norm_src, norm_params = pass_launcher(stem, post, call)
    cu = "\n".join([pre_src, post_src, conv_launcher(stem, f"Pre_{stem}", pre, direct), norm_src])
    cpp = cpp_function(stem, plan, pre, post, direct, norm_params, call)
    cls = class_name(stem, classes)
    forward = (f"{', '.join(region.outputs)} = {cls}.run(self, {x})",)
    norm_parts = ("conv_norm", "conv_batch_norm") if plan.norm.op == "batch_norm" else ("conv_norm",)
    # rows: kf_block_reduce; batch_norm: kf_bn_finalize_kernel (both norms' statistics)
    parts = ("conv", *(("conv_direct",) if direct else ()), "rows", "batch_norm", *norm_parts)
    return CudaRegion(bound_name(stem), cu, cpp, python_source(region, g, stem, cls, plan, pre, post, call), forward,
                      parts)
