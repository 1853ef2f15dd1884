"""The CUDA code of the registry's reduction-over-channels kind: convolution -> pointwise ops -> ONE reduction over
dim 1 (sum, mean, amax, amin, logsumexp; keepdim or not) or softmax / log_softmax over dim 1 -> pointwise ops.

The ops' roles are the Triton twin's (`rowstats.row_roles`, through rowreduce.py's RowPlan, a pixel for a row):
pre (full-width, before the reduction), reduce and row (per pixel), post (full-width, reading a per-pixel value;
softmax itself). Two stages in one bound function `kf_<stem>`:
  1. the convolution's launches (conv.py: either tile, transposed ones too) with the pre ops as the functor
     `Pre_<stem>`, storing y (the reduction's input) and the pre values read later or returned;
  2. kf_channel_reduce (conv_channels_source.py), a thread a pixel: the statistic over its channels (float64 sums),
     `Row_<stem>` (rowreduce.py's per-row functor) on it, then `Post_<stem>` (rowreduce.py's full-width functor, at
     the NC(D)HW element of pixel m and channel n) on each of its channels.
The Triton twin reduces in the convolution's own tile where one column tile holds a pixel's channels (y never
stored); here y is written by the convolution and read back once or twice (three times for a softmax).
Autograd: CudaRecomputeFn, the region recomputed in float64 torch.
"""

from __future__ import annotations

from kfuse.backward import class_name, region_inputs
from kfuse.cuda.conv import (
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
from kfuse.cuda.rowreduce import (
    STAT_ID,
    RowPlan,
    output_tensors,
    passed,
    post_args,
    post_struct,
    row_args,
    row_plan,
    row_struct,
)
from kfuse.ir import Graph, Region
from kfuse.regions.conv_common import row_shape_code

PIXEL_AT = "m / P * C * P + m % P + n * P"  # the post functor's NC(D)HW element: m the pixel b P + p, n the channel


def channel_launcher(stem: str, plan: RowPlan, row: list[Member] | None, post: list[Member] | None
                     ) -> tuple[str, list[str]]:
    """`kf_launch_<stem>_channels(y, B, C, P, divisor, st_a, row members..., post members..., stream)` and its
    parameters: the channel pass with the region's functors (KfNoOps where it has none)."""
    params = ["const float* y", "long long B", "long long C", "long long P", "double divisor", "float* st_a",
              *[c_param(m, "r_") for m in row or []], *[c_param(m, "q_") for m in passed(post)], "cudaStream_t stream"]
    lines = [launcher_head(f"{stem}_channels", params) + " {"]
    if row is None:
        lines.append("  KfNoOps row;")
    else:
        lines += [f"  Row_{stem} row;", *[f"  row.{m.name} = r_{m.name};" for m in row], "  row.N = 1;"]
    if post is None:
        lines.append("  KfNoOps post;")
    else:
        lines += [f"  Post_{stem} post;", *[f"  post.{m.name} = q_{m.name};" for m in passed(post)],
                  "  post.st_a = st_a;", "  post.st_b = nullptr;  // (no second statistic)", "  post.P = P;",
                  "  post.C = C;"]
    lines += [f"  return kf_channel_reduce<{STAT_ID[plan.red.op]}>(y, B, C, P, divisor, st_a, row, post, stream);",
              "}"]
    return "\n".join(lines) + "\n", params


def cpp_function(stem: str, plan: RowPlan, pre: list[Member], row: list[Member] | None, post: list[Member] | None,
                 direct: bool, channel_params: list[str]) -> str:
    """`kf_<stem>`: the convolution's launches with Pre_<stem>, then the channel pass; the outputs in region
    order."""
    params = [*[cpp_param(m, "e_") for m in inputs(pre)], "double divisor",
              *[cpp_param(m, "r_") for m in inputs(row or [])], *[cpp_param(m, "q_") for m in inputs(post or [])]]
    pre_args = [f"st[{i}].data_ptr<float>()" for i in range(len(plan.stored))] + [cpp_arg(m, "e_")
                                                                                 for m in inputs(pre)]
    passed_args = ["st[0].data_ptr<float>()", "B", "C", "P", "divisor", "stats.data_ptr<float>()",
                   *row_args(row), *post_args(plan, post)]
    setup = ["  [[maybe_unused]] const KfConvArgs& g = ops.launches.front();  // g.N: C_out, the vectors' length",
             "  const int64_t B = out_shape[0], C = out_shape[1];",
             "  int64_t P = 1;  // pixels a channel plane",
             "  for (size_t i = 2; i < out_shape.size(); ++i) P *= out_shape[i];",
             '  TORCH_CHECK(B <= 65535, "kfuse: too many samples for the channel pass: ", B);',
             f"  torch::Tensor st[{len(plan.stored)}], rt[{max(1, len(plan.rows))}], lt[{max(1, len(plan.late))}];",
             "  for (auto& t : st) t = torch::empty(out_shape, x.options());",
             f"  for (int i = 0; i < {len(plan.rows)}; ++i) rt[i] = torch::empty({{B * P}}, x.options());",
             f"  for (int i = 0; i < {len(plan.late)}; ++i) lt[i] = torch::empty(out_shape, x.options());",
             "  torch::Tensor stats = torch::empty({B * P}, x.options());"]
    return two_stage_function(stem, "channels", direct, params, launch_params(pre, "e_"), channel_params, setup,
                              pre_args, passed_args, output_tensors(plan))


def python_source(region: Region, g: Graph, stem: str, cls: str, plan: RowPlan, fed: dict[str, list[Member]]
                  ) -> str:
    """`fused_<stem>(x, weight, pre inputs..., row inputs..., post inputs..., <geometry>)` and the region's
    CudaRecomputeFn. `fed`: each functor's members by the prefix of their parameters."""
    anchor = region.anchor
    names = {p: [f"{p}_{m.name}" for m in inputs(members)] for p, members in fed.items()}
    geometry, head, operands = launcher_lines(anchor)
    by_name = {n.name: n for n in region.nodes}
    rets = [f"got[{i}]" if plan.roles[v] in ("pre", "post") else
            f"got[{i}].reshape({row_shape_code(by_name[v], anchor)})" for i, v in enumerate(region.outputs)]
    divisor = "float(geo.out_shape[1])" if plan.red.op == "mean" else "1.0"
    call = ", ".join([operands, *names["e"], "divisor", *names["r"], *names["q"]])
    body = [*head, f"divisor = {divisor}  # what the channel sum is divided by",
            f"got = ext.{bound_name(stem)}({call})",
            f"return {rets[0] if len(rets) == 1 else ', '.join(rets)}"]
    doc = (f"Fused: {', '.join(n.origin for n in region.nodes)}: the CUDA function `{bound_name(stem)}` "
           f"({tile_kernels(anchor)} with Pre_{stem}, then kf_channel_reduce). {cost_line(region, g)} Then the "
           f"channel pass: the stored {plan.red.args[0]} read once or twice for {plan.red.op}, once more by the "
           "full-width ops after it, each output written once.")
    params = ["x", "weight", *names["e"], *names["r"], *names["q"], *geometry]
    values = [m.value for members in fed.values() for m in inputs(members)]
    return function_source(region, stem, cls, params, body, doc, values)


def region_code(region: Region, g: Graph, stem: str, classes: set[str]) -> CudaRegion:
    (x,) = region_inputs(region)
    plan = row_plan(region, g)
    direct = runs_direct(region.anchor)
    pre_src, pre = conv_struct(region, f"Pre_{stem}", plan.pre, plan.stored)
    sources, row, post = [pre_src], None, None
    if plan.rows:
        src, row = row_struct(plan.red, plan.row, plan.rows, f"Row_{stem}")
        sources.append(src)
    if plan.post:
        src, post = post_struct(plan, f"Post_{stem}", at=PIXEL_AT, sizes=("P", "C"))
        sources.append(src)
    channels_src, channel_params = channel_launcher(stem, plan, row, post)
    cu = "\n".join([*sources, conv_launcher(stem, f"Pre_{stem}", pre, direct), channels_src])
    cpp = cpp_function(stem, plan, pre, row, post, direct, channel_params)
    cls = class_name(stem, classes)
    forward = (f"{', '.join(region.outputs)} = {cls}.run(self, {x})",)
    python = python_source(region, g, stem, cls, plan, {"e": pre, "r": row or [], "q": post or []})
    parts = ("conv", "conv_direct", "rows", "conv_channels") if direct else ("conv", "rows", "conv_channels")
    return CudaRegion(bound_name(stem), cu, cpp, python, forward, parts)
