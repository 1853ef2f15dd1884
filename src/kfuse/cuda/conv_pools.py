"""The CUDA code of the registry's pool-after-convolution kind: convolution -> pointwise ops -> a windowed pool
(MaxPool / AvgPool 1d-3d at any geometry torch takes, or max_pool1d / avg_pool1d of non-overlapping windows) -> ops
-> at most one global mean of its values -> ops, or convolution -> ops -> a global mean (AdaptiveAvgPool to one
pixel, a mean over every spatial dim) -> ops. Off unless KFUSE_CUDA_CONV_POOLS=1 when a file is generated
(cuda/regions.py leaves the pool a torch call otherwise, with that reason): it met the contract on an H200, but lost
its A/B against the pool as a torch call (benchmarks/cuda_backend/NOTES.md).

One bound function `kf_<stem>`:
  1. the convolution's launches (conv.py: either tile) with the ops before the pool as the functor `Pre_<stem>`,
     storing y (the pool's input; the registry kind admits no value before the pool read outside the region);
  2. a windowed pool: kf_window_pool (conv_pools_source.py) with `Post_<stem>`, the ops after the pool on each
     pooled value, storing the region's pooled outputs, or the mean's input where a mean follows;
  3. a global mean (of y, or of the pooled values): kf_row_stats<0> over (B C, pixels) rows (float64 sums / pixels),
     then kf_rows with `Row_<stem>` (rowreduce.py's per-row functor: the ops after the mean, its
     per-channel operands at the row's channel) storing a value per (sample, channel).
The Triton twin pools in the convolution's tile (the conv output never stored); here y is written and read back
once. Autograd: CudaRecomputeFn, the region recomputed in float64 torch (the pool by its own call).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
from kfuse.cuda.norms import functor_args
from kfuse.cuda.rowreduce import row_args, row_struct
from kfuse.ir import Graph, Node, Region
from kfuse.regions.conv_common import WINDOWED, is_max, mean_at, pool_at, pool_code

SWITCH = "KFUSE_CUDA_CONV_POOLS"  # "1": the kind is on (when a file is generated)
POOL_PARAMS = ["kernel_size", "pool_stride", "pool_padding", "pool_dilation", "ceil_mode", "count_include_pad",
               "divisor_override"]


def switched_on() -> bool:
    return os.environ.get(SWITCH, "0") == "1"


@dataclass(frozen=True)
class PoolPlan:
    """A pool region cut at its pool and mean."""

    pool: Node | None  # the windowed pool (None: a global mean of the convolution's pixels)
    pre: tuple[Node, ...]  # the ops between the convolution and the pool (or mean)
    post: tuple[Node, ...]  # the ops after a windowed pool (up to its mean)
    mean: Node | None  # the global mean, if any
    after: tuple[Node, ...]  # the ops after the mean
    y: str  # the pool's (or mean's) input, stored by the convolution's functor
    pooled: tuple[str, ...]  # what the pool's functor stores: the region's outputs, or the mean's input
    rows: tuple[str, ...]  # what the row functor stores after a mean: the region's outputs
    outputs: tuple[str, ...]  # the region's outputs, in its order


def pool_plan(region: Region) -> PoolPlan:
    nodes = list(region.nodes)
    at, m_at = pool_at(nodes), mean_at(nodes)
    first = nodes[at]
    windowed = first.op in WINDOWED
    mean = nodes[m_at] if m_at is not None else None
    post = tuple(nodes[at + 1:m_at]) if windowed else ()
    after = tuple(nodes[m_at + 1:]) if m_at is not None else ()
    outputs = tuple(region.outputs)  # all after the pool, or at or after the mean where there is one (the registry's)
    pooled = ((mean.args[0],) if mean is not None else outputs) if windowed else ()
    return PoolPlan(first if windowed else None, tuple(nodes[1:at]), post, mean, after, first.args[0], pooled,
                    outputs if mean is not None else (), outputs)


def pass_launcher(stem: str, plan: PoolPlan, post: list[Member] | None, row: list[Member] | None
                  ) -> tuple[str, list[str]]:
    """`kf_launch_<stem>_pool(y, B, C, OD, OH, OW, pool, divisor, count_pad, z, st_a, post members..., row
    members..., stream)`: the windowed pool (where the region has one), then the mean (where it has one) over the
    pool's stored values z or y."""
    params = ["const float* y", "long long B", "long long C", "long long OD", "long long OH", "long long OW",
              "const long long* pool", "int divisor", "bool count_pad", "float* st_a",
              *[c_param(m, "q_") for m in post or []], *[c_param(m, "r_") for m in row or []], "cudaStream_t stream"]
    lines = [launcher_head(f"{stem}_pool", params) + " {", "  int err = 0;"]
    if plan.pool is not None:
        lines += ["  const KfPoolGeo g = kf_pool_geo(OD, OH, OW, pool, divisor, count_pad);",
                  f"  Post_{stem} post;", *[f"  post.{m.name} = q_{m.name};" for m in post],
                  "  post.P = g.QD * g.QH * g.QW;",
                  f"  err = kf_window_pool<{str(is_max(plan.pool)).lower()}>(y, B * C, C, g, post, stream);"]
    if plan.mean is not None:  # over the pooled values the pool's functor stored, or over y
        values, pixels = ("post.out0", "post.P") if plan.pool is not None else ("y", "OD * OH * OW")
        lines += [f"  Row_{stem} row;", *[f"  row.{m.name} = r_{m.name};" for m in row], "  row.N = 1;",
                  f"  if (err == 0) err = kf_row_stats<0>({values}, B * C, {pixels}, (double)({pixels}), 0.0f, st_a, "
                  "nullptr, stream);",
                  "  if (err == 0) err = kf_rows(B * C, st_a, row, stream, C);  // the row's channel: m % C"]
    return "\n".join([*lines, "  return err;", "}"]) + "\n", params


def cpp_function(stem: str, plan: PoolPlan, pre: list[Member], post: list[Member] | None, row: list[Member] | None,
                 direct: bool, pool_params: list[str]) -> str:
    """`kf_<stem>`: the convolution's launches with Pre_<stem>, then the pool pass; the outputs in region order."""
    params = [*[cpp_param(m, "e_") for m in inputs(pre)], "std::vector<int64_t> pool", "int64_t divisor",
              "bool count_pad", *[cpp_param(m, "q_") for m in inputs(post or [])],
              *[cpp_param(m, "r_") for m in inputs(row or [])]]
    pre_args = ["y.data_ptr<float>()", *[cpp_arg(m, "e_") for m in inputs(pre)]]
    pass_args = ["y.data_ptr<float>()", "B", "C", "g.FD", "g.FH", "g.FW", "pg.data()",
                 "static_cast<int>(divisor)", "count_pad", "stats.data_ptr<float>()",
                 *functor_args(post or [], (), ()), *row_args(row)]
    rows = plan.mean is not None
    n_rows = len(plan.rows)
    setup = ["  const KfConvArgs& g = ops.launches.front();  // the plane's sizes, C_out (g.N) for the vectors",
             "  const int64_t B = out_shape[0], C = out_shape[1];",
             '  TORCH_CHECK(pool.size() == 16, "kfuse: a pool geometry of 16 sizes expected, got ", pool.size());',
             "  const std::vector<long long> pg(pool.begin(), pool.end());  // the launcher's long long",
             "  torch::Tensor y = torch::empty(out_shape, x.options());",
             f"  torch::Tensor lt[{max(1, len(plan.pooled))}], rt[{max(1, n_rows)}];",
             "  const int64_t Q = pool[1] * pool[2] * pool[3];  // pooled pixels a plane",
             f"  for (int i = 0; i < {len(plan.pooled)}; ++i) lt[i] = torch::empty({{B, C, Q}}, x.options());",
             f"  for (int i = 0; i < {n_rows}; ++i) rt[i] = torch::empty({{B * C}}, x.options());",
             f"  torch::Tensor stats = torch::empty({{{'B * C' if rows else '0'}}}, x.options());"]
    return two_stage_function(stem, "pool", direct, params, launch_params(pre, "e_"), pool_params, setup,
                              pre_args, pass_args, output_tensors(plan))


def output_tensors(plan: PoolPlan) -> list[str]:
    """The region's outputs in its order: the pooled tensors lt, or the per-(sample, channel) ones rt."""
    return [f"rt[{plan.rows.index(v)}]" if plan.rows else f"lt[{plan.pooled.index(v)}]" for v in plan.outputs]


def output_shape(n: Node, plan: PoolPlan) -> str:
    """An output's shape at run time: the pool's (pool.out_shape), or (N, C) and the mean's unit dims."""
    if not plan.rows:
        return "pool.out_shape"
    return f"(geo.out_shape[0], geo.out_shape[1]{', 1' * (len(n.shape) - 2)})"


def python_source(region: Region, g: Graph, stem: str, cls: str, plan: PoolPlan, fed: dict[str, list[Member]]
                  ) -> str:
    """`fused_<stem>(x, weight, pre inputs..., post inputs..., row inputs..., <geometry>, <the pool's>)` and the
    region's CudaRecomputeFn. `fed`: each functor's members by the prefix of their parameters."""
    anchor = region.anchor
    names = {p: [f"{p}_{m.name}" for m in inputs(members)] for p, members in fed.items()}
    geometry, head, operands = launcher_lines(anchor)
    by_name = {n.name: n for n in region.nodes}
    windowed = plan.pool is not None
    pool_lines = (["pool = pool_geometry(geo, kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode)",
                   "pool_args = list(pool.args()), int(divisor_override or 0), bool(count_include_pad)"] if windowed
                  else ["pool_args = [0] * 16, 0, True  # no windowed pool: a mean of the convolution's pixels"])
    call = ", ".join([operands, *names["e"], "*pool_args", *names["q"], *names["r"]])
    rets = [f"got[{i}].reshape({output_shape(by_name[v], plan)})" for i, v in enumerate(plan.outputs)]
    body = [*head, *pool_lines, f"got = ext.{bound_name(stem)}({call})",
            f"return {rets[0] if len(rets) == 1 else ', '.join(rets)}"]
    passes = ", ".join([*(["kf_window_pool"] if windowed else []),
                        *(["kf_row_stats<0> and kf_rows"] if plan.mean is not None else [])])
    doc = (f"Fused: {', '.join(n.origin for n in region.nodes)}: the CUDA function `{bound_name(stem)}` "
           f"({tile_kernels(anchor)} with Pre_{stem}, then {passes}). {cost_line(region, g)} Then the pool's pass: "
           f"the stored {plan.y} read once, the pooled values written once.")
    params = ["x", "weight", *names["e"], *names["q"], *names["r"], *geometry, *(POOL_PARAMS if windowed else [])]
    values = [m.value for members in fed.values() for m in inputs(members)]
    return function_source(region, stem, cls, params, body, doc, values, pool_code(plan.pool) if windowed else ())


def region_code(region: Region, g: Graph, stem: str, classes: set[str]) -> CudaRegion:
    (x,) = region_inputs(region)
    plan = pool_plan(region)
    direct = runs_direct(region.anchor)
    pre_src, pre = conv_struct(region, f"Pre_{stem}", plan.pre, (plan.y,))
    sources, post, row = [pre_src], None, None
    if plan.pool is not None:
        src, post = row_struct(plan.pool, plan.post, plan.pooled, f"Post_{stem}", "Per pooled value",
                               at="m + n * P", sizes=("P",))  # P: the pooled pixels a plane
        sources.append(src)
    if plan.mean is not None:
        src, row = row_struct(plan.mean, plan.after, plan.rows, f"Row_{stem}")
        sources.append(src)
    pass_src, pool_params = pass_launcher(stem, plan, post, row)
    cu = "\n".join([*sources, conv_launcher(stem, f"Pre_{stem}", pre, direct), pass_src])
    cpp = cpp_function(stem, plan, pre, post, row, direct, pool_params)
    cls = class_name(stem, classes)
    forward = (f"{', '.join(region.outputs)} = {cls}.run(self, {x})",)
    python = python_source(region, g, stem, cls, plan, {"e": pre, "q": post or [], "r": row or []})
    parts = ("conv", *(("conv_direct",) if direct else ()), "rows", "conv_pools")
    return CudaRegion(bound_name(stem), cu, cpp, python, forward, parts)
