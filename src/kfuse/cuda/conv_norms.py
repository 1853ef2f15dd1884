"""The CUDA code of the registry's norm-after-convolution kind: convolution -> pointwise ops -> GroupNorm or
InstanceNorm (no running statistics; one channel a group) -> pointwise ops. On unless KFUSE_CUDA_CONV_NORMS=0 when a
file is generated (then cuda/regions.py leaves the norm a torch call after the convolution's region, with that
reason: the A/B against it).

Two stages in one bound function `kf_<stem>`:
  1. the convolution's launches (conv.py: either tile, transposed ones too) with the ops before the norm as the
     functor `Pre_<stem>`, storing u (the norm's input) and the region's outputs before the norm;
  2. kf_conv_norm (conv_norm_source.py): each (sample, group)'s float64 statistics over its contiguous run of u, then
     the normalized value, the norm's affine and `Post_<stem>` (the ops after the norm, which may read u) on each
     element, storing the region's outputs after the norm.
The Triton twin computes the statistics from per-tile partials in the convolution's own tile; here u is written by
the convolution and read back (three reads). Autograd: CudaRecomputeFn, the region recomputed in float64 torch.
"""

from __future__ import annotations

import os

from kfuse.backward import class_name, region_inputs
from kfuse.cuda.conv import (
    AT,
    conv_launcher,
    conv_params,
    conv_struct,
    cost_line,
    launch_params,
    launcher_lines,
    operands_lines,
    runs_direct,
    tile_kernels,
)
from kfuse.cuda.epilogue import CudaRegion, recompute_function_source
from kfuse.cuda.glue import Member, bound_name, c_param, cpp_arg, cpp_param, inputs, launcher_head
from kfuse.cuda.norms import NormPlan, _vector, norm_plan, output_tensors, post_args, post_struct
from kfuse.ir import Graph, Node, Region
from kfuse.regions.common import docstring
from kfuse.regions.conv_common import geometry_code

NORMS = ("group_norm", "instance_norm")
SWITCH = "KFUSE_CUDA_CONV_NORMS"  # "0": the kind is off (when a file is generated)


def switched_on() -> bool:
    return os.environ.get(SWITCH, "1") != "0"


def norm_values(norm: Node) -> tuple[str, str, str, str]:
    """The Python expressions of the norm's groups (None: one channel a group), weight, bias (empty tensors where
    absent) and eps."""
    if norm.op == "group_norm":
        _x, groups, w, b, eps = norm.args
        return f"int({groups.expr()})", _vector(w), _vector(b), f"float({eps.expr()})"
    _x, w, b, eps = norm.args
    return "None", _vector(w), _vector(b), f"float({eps.expr()})"


def norm_launcher(stem: str, post: list[Member]) -> tuple[str, list[str]]:
    """`kf_launch_<stem>_norm(u, B, C, P, group, eps, gamma, beta, mean, rstd, post members..., stream)` and its
    parameters."""
    params = ["const float* u", "long long B", "long long C", "long long P", "int group", "float eps",
              "const float* gamma", "const float* beta", "float* mean", "float* rstd", *[c_param(m) for m in post],
              "cudaStream_t stream"]
    sets = [f"  post.{m.name} = {m.name};" for m in post]
    return "\n".join([launcher_head(f"{stem}_norm", params) + " {", f"  Post_{stem} post;", *sets, "  post.P = P;",
                      "  return kf_conv_norm(u, B, C, P, group, eps, gamma, beta, mean, rstd, post, stream);",
                      "}"]) + "\n", params


def cpp_function(stem: str, plan: NormPlan, pre: list[Member], post: list[Member], direct: bool,
                 norm_params: list[str]) -> str:
    """`kf_<stem>`: the convolution's launches with Pre_<stem>, then the norm's pass; the outputs in region order."""
    params = [*[cpp_param(m, "e_") for m in inputs(pre)], "int64_t groups", "torch::Tensor gamma", "torch::Tensor beta",
              "double eps", *[cpp_param(m, "q_") for m in inputs(post)]]
    pre_args = [f"st[{i}].data_ptr<float>()" for i in range(len(plan.stored))] + [cpp_arg(m, "e_")
                                                                                 for m in inputs(pre)]
    passed = post_args(plan, post)
    function = bound_name(stem)
    lines = [f"{launcher_head(stem, launch_params(pre, 'e_'))};", f"{launcher_head(f'{stem}_norm', norm_params)};",
             "",
             f"std::vector<torch::Tensor> {function}({conv_params(direct)}, {', '.join(params)}) {{",
             *operands_lines(direct),
             "  const KfConvArgs& g = ops.launches.front();  // C_out (g.N) for the per-channel vectors",
             "  const int64_t B = out_shape[0], C = out_shape[1], P = g.FD * g.FH * g.FW;",
             '  TORCH_CHECK(groups > 0 && C % groups == 0, "kfuse: GroupNorm of ", C, " channels in ", groups, '
             '" groups");',
             '  TORCH_CHECK(C <= 65535 && B <= 65535, "kfuse: too many channels or samples for the norm\'s pass");',
             '  const float* gamma_p = kf_optional_vector(gamma, C, "the norm\'s weight", a);',
             '  const float* beta_p = kf_optional_vector(beta, C, "the norm\'s bias", a);',
             f"  torch::Tensor st[{len(plan.stored)}], lt[{max(1, len(plan.late))}];",
             "  for (auto& t : st) t = torch::empty(out_shape, x.options());",
             f"  for (int i = 0; i < {len(plan.late)}; ++i) lt[i] = torch::empty(out_shape, x.options());",
             "  torch::Tensor stats = torch::empty({2, B * groups}, x.options());",
             "  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();",
             "  for (const KfConvArgs& l : ops.launches)",
             f"    kf_check(kf_launch_{stem}(l, {', '.join(pre_args)}, stream), \"{function}\");",
             f"  kf_check(kf_launch_{stem}_norm(st[0].data_ptr<float>(), B, C, P, static_cast<int>(C / groups), "
             "static_cast<float>(eps), gamma_p, beta_p, stats.data_ptr<float>(), "
             f"stats.data_ptr<float>() + B * groups{''.join(', ' + a for a in passed)}, stream), "
             f"\"{function}\");",
             f"  return {{{', '.join(output_tensors(plan))}}};",
             "}"]
    return "\n".join(lines) + "\n"


def python_source(region: Region, g: Graph, stem: str, cls: str, plan: NormPlan, pre: list[Member],
                  post: list[Member]) -> str:
    """`fused_<stem>(x, weight, pre inputs..., norm_groups, gamma, beta, eps, post inputs..., <geometry>)` and the
    region's CudaRecomputeFn."""
    anchor = region.anchor
    e = [f"e_{m.name}" for m in inputs(pre)]
    q = [f"q_{m.name}" for m in inputs(post)]
    geometry, head, operands = launcher_lines(anchor)
    checks = ["C, S = geo.out_shape[1], torch.Size(geo.out_shape[2:]).numel()",
              "norm_g = C if norm_groups is None else norm_groups  # InstanceNorm: one channel a group"]
    if plan.norm.op == "instance_norm":  # torch's F.instance_norm check
        checks += ["if S == 1:",
                   "    raise ValueError(f'Expected more than 1 spatial element when training, got input size "
                   "{tuple(geo.out_shape)}')"]
    call = ", ".join([operands, *e, "norm_g", "gamma", "beta", "eps", *q])
    body = [*head, *checks, f"got = ext.{bound_name(stem)}({call})",
            f"return {'got[0]' if len(region.outputs) == 1 else 'tuple(got)'}"]
    doc = (f"Fused: {', '.join(n.origin for n in region.nodes)}: the CUDA function `{bound_name(stem)}` "
           f"({tile_kernels(anchor)} with Pre_{stem}, then kf_conv_norm with Post_{stem}). {cost_line(region, g)} "
           "Then the norm's pass: u read three times, each output written once.")
    params = ", ".join(["x", "weight", *e, "norm_groups", "gamma", "beta", "eps", *q, *geometry])
    launcher = "\n".join([f"def fused_{stem}({params}):", docstring(doc), *[f"    {ln}" for ln in body]]) + "\n"
    values = [*[m.value for m in inputs(pre)], *norm_values(plan.norm), *[m.value for m in inputs(post)]]
    launch = (f"return fused_{stem}(x, {anchor.args[1].expr()}, {', '.join(values)}, "
              f"{', '.join(geometry_code(anchor))})")
    return launcher + "\n\n" + recompute_function_source(region, stem, cls, launch, "kernels")


def region_code(region: Region, g: Graph, stem: str, classes: set[str]) -> CudaRegion:
    (x,) = region_inputs(region)
    plan = norm_plan(region, NORMS)
    direct = runs_direct(region.anchor)
    pre_src, pre = conv_struct(region, f"Pre_{stem}", plan.pre, plan.stored)
    post_src, post = post_struct(plan, f"Post_{stem}", at=AT, sizes=("P",))
    norm_src, norm_params = norm_launcher(stem, post)
    cu = "\n".join([pre_src, post_src, conv_launcher(stem, f"Pre_{stem}", pre, direct), norm_src])
    cpp = cpp_function(stem, plan, pre, post, direct, norm_params)
    cls = class_name(stem, classes)
    forward = (f"{', '.join(region.outputs)} = {cls}.run(self, {x})",)
    parts = ("conv", "conv_direct", "rows", "conv_norm") if direct else ("conv", "rows", "conv_norm")
    return CudaRegion(bound_name(stem), cu, cpp, python_source(region, g, stem, cls, plan, pre, post), forward,
                      parts)
