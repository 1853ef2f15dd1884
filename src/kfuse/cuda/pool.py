"""The CUDA code of the pool kind: GEMM -> ops -> MaxPool1d / AvgPool1d over the features (windows of k,
stride k, no padding, floor) -> ops on the pooled values -> at most one reduction over them -> per-row ops.

One bound function `kf_<stem>` runs, with rows_source.py's kernels:
  1. the GEMM with the ops before the pool as its functor `Pre_<stem>`, storing y (the pool's input) and the values
     before the pool read outside the region, and z for backward;
  2. kf_pool<MAX>: each window's max or mean, then `Post_<stem>` on the pooled value (the ops after the pool,
     numbers and one-element parameters), storing the pooled outputs and the reduction's input;
  3. (where a reduction over the pooled features follows) kf_row_stats<STAT> over the stored (M, N / k) values and
     kf_rows with `Row_<stem>`: the reduction's value and the per-row ops.
Bytes beyond the GEMM: y written once and read once, the pooled outputs (k times narrower) written once. The Triton
twin pools inside the GEMM's tile (no y at all). The window is read from the module at run time.
"""

from __future__ import annotations

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
from kfuse.cuda.norms import gemm_struct
from kfuse.cuda.rowreduce import STAT_ID, row_struct
from kfuse.cuda.spellings import EpilogueArgs, chain_lines, functor_struct
from kfuse.ir import Graph, Node, Region
from kfuse.ops import POOL_OPS, REDUCE_OPS
from kfuse.regions.common import docstring, gemm_cost, var


@dataclass(frozen=True)
class PoolPlan:
    """Where a pool region's values are computed and stored."""

    pool: Node
    pre: tuple[Node, ...]  # the ops between the GEMM and the pool
    post: tuple[Node, ...]  # the ops on the pooled values
    red: Node | None  # a reduction over the pooled features
    row: tuple[Node, ...]  # the per-row ops after it
    stored: tuple[str, ...]  # (M, N): y first, then earlier values read outside
    late: tuple[str, ...]  # (M, N / k): the pooled outputs, then the reduction's input
    rows: tuple[str, ...]  # (M,): the reduction's and the per-row ops' outputs
    outputs: tuple[str, ...]


def pool_plan(region: Region) -> PoolPlan:
    nodes = list(region.nodes)
    at = next(i for i, n in enumerate(nodes) if n.op in POOL_OPS)
    red_at = next((i for i, n in enumerate(nodes) if i > at and n.op in REDUCE_OPS), len(nodes))
    early = {n.name for n in nodes[:at]}
    pooled = {n.name for n in nodes[at:red_at]}
    red = nodes[red_at] if red_at < len(nodes) else None
    stored = tuple(dict.fromkeys([nodes[at].args[0], *[v for v in region.outputs if v in early]]))
    late = tuple(dict.fromkeys([*[v for v in region.outputs if v in pooled], *([red.args[0]] if red else [])]))
    rows = tuple(v for v in region.outputs if v not in early and v not in pooled)
    return PoolPlan(nodes[at], tuple(nodes[1:at]), tuple(nodes[at + 1:red_at]), red, tuple(nodes[red_at + 1:]),
                    stored, late, rows, region.outputs)


def post_struct(plan: PoolPlan, struct: str) -> tuple[str, list[Member]]:
    """The pool pass's functor: acc is the pooled value; the ops after the pool; stores plan.late (N = N / k)."""
    args = EpilogueArgs()
    env = {plan.pool.name: var(plan.pool.name)}
    body = [f"const float {var(plan.pool.name)} = acc;  // {plan.pool.origin}"]
    body += chain_lines(plan.post, env, args)
    body += [f"out{i}[at] = {env[v]};" for i, v in enumerate(plan.late)]
    doc = f"After {plan.pool.origin}: " + (" -> ".join(n.origin for n in plan.post) or "its stores") + "."
    members = [Member(f"out{i}", "out") for i in range(len(plan.late))]
    return functor_struct(struct, doc, members, args, body), [*members, *args.members]


def launch_params(pre: list[Member], post: list[Member], row: list[Member] | None) -> list[str]:
    return ["const KfGemmArgs& g", *[c_param(m, "e_") for m in pre], "int k", "double divisor", "float* st_a",
            "float* st_b", *[c_param(m, "q_") for m in post], *[c_param(m, "r_") for m in row or []],
            "cudaStream_t stream"]


def cuda_launcher(stem: str, plan: PoolPlan, pre: list[Member], post: list[Member], row: list[Member] | None) -> str:
    is_max = "true" if plan.pool.op == "max_pool1d" else "false"
    lines = [launcher_head(stem, launch_params(pre, post, row)) + " {", f"  Pre_{stem} pre;",
             *[f"  pre.{m.name} = e_{m.name};" for m in pre], "  pre.N = g.N;",
             f"  Post_{stem} post;", *[f"  post.{m.name} = q_{m.name};" for m in post], "  post.N = g.N / k;",
             "  int err = kf_gemm(g, pre, stream);",
             f"  if (err == 0) err = kf_pool<{is_max}>(pre.out0, g.M, g.N, k, post, stream);"]
    if plan.red is not None:
        p = f"post.out{plan.late.index(plan.red.args[0])}"
        lines += [f"  if (err == 0) err = kf_row_stats<{STAT_ID[plan.red.op]}>({p}, g.M, g.N / k, divisor, 0.0f, "
                  "st_a, st_b, stream);",
                  f"  Row_{stem} row;", *[f"  row.{m.name} = r_{m.name};" for m in row or []], "  row.N = 1;",
                  "  if (err == 0) err = kf_rows(g.M, st_a, row, stream);"]
    return "\n".join([*lines, "  return err;", "}"]) + "\n"


def cpp_function(stem: str, plan: PoolPlan, pre: list[Member], post: list[Member], row: list[Member] | None) -> str:
    params = [*[cpp_param(m, "e_") for m in inputs(pre)], "int64_t k", "double divisor",
              *[cpp_param(m, "q_") for m in inputs(post)], *[cpp_param(m, "r_") for m in inputs(row or [])]]
    check = 'TORCH_CHECK(k > 0 && g.N / k > 0, "kfuse: pooling ", g.N, " features in windows of ", k);'
    lines = [*bound_opening(stem, launch_params(pre, post, row), params, (check,)),
             f"  torch::Tensor st[{len(plan.stored)}], lt[{len(plan.late)}], rt[{max(1, len(plan.rows))}];",
             "  for (auto& t : st) t = torch::empty({g.M, g.N}, options);",
             "  for (auto& t : lt) t = torch::empty({g.M, g.N / k}, options);",
             f"  for (int i = 0; i < {len(plan.rows)}; ++i) rt[i] = torch::empty({{g.M}}, options);",
             "  torch::Tensor stats = torch::empty({2, g.M}, options);",
             "  torch::Tensor z = store_z ? torch::empty({g.M, g.N}, options) : torch::Tensor();"]
    args = [f"st[{m.name[3:]}].data_ptr<float>()" if m.kind == "out" else
            "store_z ? z.data_ptr<float>() : nullptr" if m.kind == "z" else cpp_arg(m, "e_") for m in pre]
    args += ["static_cast<int>(k)", "divisor", "stats.data_ptr<float>()", "stats.data_ptr<float>() + g.M"]
    args += [f"lt[{m.name[3:]}].data_ptr<float>()" if m.kind == "out" else cpp_arg(m, "q_") for m in post]
    args += [f"rt[{m.name[3:]}].data_ptr<float>()" if m.kind == "out" else cpp_arg(m, "r_") for m in row or []]

    def out(v: str) -> str:
        return (f"st[{plan.stored.index(v)}]" if v in plan.stored else f"lt[{plan.late.index(v)}]" if v in plan.late
                else f"rt[{plan.rows.index(v)}]")

    return "\n".join(lines + launch_and_return(stem, args, [out(v) for v in plan.outputs])) + "\n"


def python_launcher(region: Region, g: Graph, stem: str, plan: PoolPlan, names: list[str]) -> str:
    shapes = {n.name: n.shape for n in region.nodes}
    n_out = len(region.outputs)

    def reshape(v: str) -> str:  # the pooled width follows the window read at run time
        dims = [str(d) for d in shapes[v][1:]]
        if v in plan.late and dims:
            dims[-1] = "-1"
        return f"reshape(x2.shape[0]{''.join(', ' + d for d in dims)})"

    rets = [f"got[{i}].{reshape(v)}.to(x.dtype)" for i, v in enumerate(region.outputs)]
    doc = (f"Fused: {', '.join(n.origin for n in region.nodes)}: the CUDA function `{bound_name(stem)}` of CUDA_SRC "
           f"(the GEMM with Pre_{stem}, then {plan.pool.origin} with Post_{stem}"
           f"{', then the row statistics and Row_' + stem if plan.red else ''}). {gemm_cost(region, g)} save_z: also "
           "return z = x W^T + b (kept for backward).")
    mean = plan.red is not None and plan.red.op == "mean"
    body = ["ext = cuda_module()",
            "x2 = x.reshape(-1, x.shape[-1])",
            f"ops, scheme = gemm_operands(ext, x2, weight, {region.anchor.op == 'matmul'}, GEMM_SCHEME)",
            f"n_out = weight.shape[{1 if region.anchor.op == 'matmul' else 0}]",
            "window = int(kernel)",
            f"divisor = float(n_out // window) if {mean} else 1.0",
            f"got = ext.{bound_name(stem)}(*ops, scheme, {', '.join(names)}, save_z)",
            f"outs = [{', '.join(rets)}]",
            "if save_z:",
            f"    return tuple(outs), got[{n_out}].reshape(x2.shape[0], n_out)",
            "return outs[0]" if n_out == 1 else "return tuple(outs)"]
    params = ", ".join(["x", "weight", *[n for n in names if n not in ("window", "divisor")], "kernel",
                        "save_z=False"])
    return "\n".join([f"def fused_{stem}({params}):", docstring(doc), *[f"    {ln}" for ln in body]]) + "\n"


def region_code(region: Region, g: Graph, stem: str, classes: set[str]) -> CudaRegion:
    """The CUDA pieces of a GEMM -> ... -> pool -> ... region."""
    (x,) = region_inputs(region)
    plan = pool_plan(region)
    pre_src, pre = gemm_struct(region, plan.pre, plan.stored, plan.pool, f"Pre_{stem}")
    post_src, post = post_struct(plan, f"Post_{stem}")
    parts, row = [pre_src, post_src], None
    if plan.red is not None:
        src, row = row_struct(plan.red, plan.row, plan.rows, f"Row_{stem}")
        parts.append(src)
    cu = "\n".join([*parts, cuda_launcher(stem, plan, pre, post, row)])
    cpp = cpp_function(stem, plan, pre, post, row)
    e = [f"e_{m.name}" for m in inputs(pre)]
    q = [f"q_{m.name}" for m in inputs(post)]
    r = [f"r_{m.name}" for m in inputs(row or [])]
    cls = class_name(stem, classes)
    values = [*[m.value for m in inputs(pre)], *[m.value for m in inputs(post)],
              *[m.value for m in inputs(row or [])], plan.pool.args[1].expr()]
    python = python_launcher(region, g, stem, plan, [*e, "window", "divisor", *q, *r]) + "\n\n" + \
        function_source(region, stem, cls, values)
    forward = (f"{', '.join(region.outputs)} = {cls}.run(self, {x})",)
    return CudaRegion(bound_name(stem), cu, cpp, python, forward, ("rows",))
