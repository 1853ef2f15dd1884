"""The CUDA code of the row reduction kind: GEMM -> ops -> ONE reduction (sum, mean, amax, amin,
logsumexp) or row norm (softmax, log_softmax, LayerNorm, InstanceNorm) over the GEMM's features -> ops.

The ops' roles are the Triton twin's (`rowstats.row_roles`): pre (full-width, before the reduction), reduce (the
reduction's per-row value), row (per-row ops after it), post (full-width ops reading a per-row value, and a row
norm itself). One bound function `kf_<stem>` runs, with rows_source.py's kernels:
  1. the GEMM with the pre ops as its functor `Pre_<stem>`, storing y (the reduction's input) and every pre value
     read later (outside the region or by a post op), and z for backward;
  2. kf_row_stats<STAT>: a block per row of y, the statistic (float64 sums; max; min; logsumexp; mean and
     1 / sqrt(var + eps)) into st_a, st_b (M,);
  3. (where the region has per-row values) kf_rows with `Row_<stem>`: the reduction's value and the row ops, a
     thread per row, storing the per-row outputs and the per-row values the post ops read;
  4. (where it has post ops) kf_rows_apply with `Post_<stem>`: the row norm's formula and the post ops on each
     element of y, reading the stored pre values, the per-row values and the statistics.
Bytes beyond the GEMM: y written once and read once or twice by the statistics (two-pass statistics, the second
mostly from L2), once more by the apply pass; the outputs written once. The Triton twin computes per-tile partials
in the GEMM's epilogue instead of re-reading y for the statistics.
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
from kfuse.cuda.norms import functor_args, gemm_struct
from kfuse.cuda.spellings import EpilogueArgs, chain_lines, functor_struct
from kfuse.ir import Graph, Node, Param, Region
from kfuse.ops import REDUCE_OPS, ROW_NORM_OPS
from kfuse.regions.common import docstring, gemm_cost, var
from kfuse.regions.rowstats import row_roles

STAT_ID = {"sum": 0, "mean": 0, "amax": 1, "amin": 2, "logsumexp": 3, "softmax": 3, "log_softmax": 3,
           "layer_norm": 4, "instance_norm": 4}


@dataclass(frozen=True)
class RowPlan:
    """Where a row-reduction region's values are computed and stored."""

    red: Node
    pre: tuple[Node, ...]  # full-width ops before the reduction (the GEMM's functor)
    row: tuple[Node, ...]  # per-row ops after it
    post: tuple[Node, ...]  # full-width ops reading a per-row value (a row norm first among them)
    stored: tuple[str, ...]  # what the GEMM's functor stores: y first, then pre values read later
    saved: tuple[str, ...]  # the stored values the post functor reads (y excepted: it is the apply pass's acc)
    rows: tuple[str, ...]  # the per-row values the row functor stores: outputs, then those the post ops read
    row_read: tuple[str, ...]  # the per-row values the post functor reads
    late: tuple[str, ...]  # the region's full-width outputs computed by the apply pass
    outputs: tuple[str, ...]  # the region's outputs, in its order
    roles: dict


def row_plan(region: Region, g: Graph) -> RowPlan:
    nodes = list(region.nodes)
    roles = row_roles(nodes, g)
    red = next(n for n in nodes[1:] if n.op in REDUCE_OPS or n.op in ROW_NORM_OPS)
    pre = tuple(n for n in nodes[1:] if roles[n.name] == "pre")
    row = tuple(n for n in nodes if roles[n.name] == "row")
    post = tuple(n for n in nodes if roles[n.name] == "post")
    y = red.args[0]
    reads = [a for n in post for a in n.value_args()]
    saved = tuple(dict.fromkeys(a for a in reads if roles.get(a) == "pre" and a != y))
    stored = tuple(dict.fromkeys([y, *[v for v in region.outputs if roles[v] == "pre"], *saved]))
    row_read = tuple(dict.fromkeys(a for a in reads if roles.get(a) in ("reduce", "row")))
    rows = tuple(dict.fromkeys([*[v for v in region.outputs if roles[v] in ("reduce", "row")], *row_read]))
    late = tuple(v for v in region.outputs if roles[v] == "post")
    return RowPlan(red, pre, row, post, stored, saved, rows, row_read, late, region.outputs, roles)


def row_struct(red: Node, row, rows, struct: str, what: str = "Per row", **where) -> tuple[str, list[Member]]:
    """The per-row functor: acc is the reduction `red`'s value; the per-row ops `row`; stores `rows` at m (N = 1;
    `where`: functor_struct's `at` and `sizes` for another element, `what` the value a call is, for its comment)."""
    args = EpilogueArgs()
    env = {red.name: var(red.name)}
    body = [f"const float {var(red.name)} = acc;  // {red.origin}"]
    body += chain_lines(row, env, args)
    body += [f"out{i}[at] = {env[v]};" for i, v in enumerate(rows)]
    members = [Member(f"out{i}", "out") for i in range(len(rows))]
    doc = f"{what} after {red.origin}: " + (" -> ".join(n.origin for n in row) or "its value") + "."
    return functor_struct(struct, doc, members, args, body, **where), [*members, *args.members]


def norm_lines(n: Node, env: dict[str, str], args: EpilogueArgs) -> list[str]:
    """A row norm on the element y, from the row's statistics st_a (logsumexp, or the mean) and st_b (1 / std)."""
    yv, out = env[n.args[0]], var(n.name)
    if n.op == "softmax":
        return [f"const float {out} = expf({yv} - st_a[m]);  // {n.origin}: exp(y - logsumexp)"]
    if n.op == "log_softmax":
        return [f"const float {out} = {yv} - st_a[m];  // {n.origin}"]
    expr = f"({yv} - st_a[m]) * st_b[m]"
    w, b = n.args[1], n.args[2]
    if isinstance(w, Param):
        expr = f"{expr} * {args.operand(w, env)}"
    if isinstance(b, Param):
        expr = f"{expr} + {args.operand(b, env)}"
    return [f"const float {out} = {expr};  // {n.origin}"]


def post_struct(plan: RowPlan, struct: str, **where) -> tuple[str, list[Member]]:
    """The apply pass's functor: acc is y at (m, n), m the row; the row norm and the post ops; stores plan.late
    (`where`: the element's `at` and `sizes`, functor_struct's, where they are not a GEMM's)."""
    args = EpilogueArgs()
    y = plan.red.args[0]
    env = {y: var(y)}
    body = [f"const float {var(y)} = acc;  // the input of {plan.red.origin}"]
    for i, v in enumerate(plan.saved):
        body.append(f"const float {var(v)} = sv{i}[at];  // stored by the GEMM's epilogue")
        env[v] = var(v)
    for i, v in enumerate(plan.row_read):
        body.append(f"const float {var(v)} = rv{i}[m];  // a per-row value")
        env[v] = var(v)
    for n in plan.post:
        body += norm_lines(n, env, args) if n is plan.red else chain_lines([n], env, args)
        env[n.name] = var(n.name)
    body += [f"out{i}[at] = {env[v]};" for i, v in enumerate(plan.late)]
    members = [*[Member(f"out{i}", "out") for i in range(len(plan.late))],
               *[Member(f"sv{i}", "saved") for i in range(len(plan.saved))],
               *[Member(f"rv{i}", "row") for i in range(len(plan.row_read))],
               Member("st_a", "row"), Member("st_b", "row")]
    doc = "The full-width ops after the row statistics: " + " -> ".join(n.origin for n in plan.post) + "."
    return functor_struct(struct, doc, members, args, body, **where), [*members, *args.members]


def _eps(red: Node) -> str:
    return f"float({red.args[3].expr()})" if red.op in ("layer_norm", "instance_norm") else "0.0"


def passed(post: list[Member] | None) -> list[Member]:
    """The post functor's members the launcher is given (the statistics' pointers are its own)."""
    return [m for m in post or [] if m.name not in ("st_a", "st_b")]


def launch_params(pre: list[Member], row: list[Member] | None, post: list[Member] | None) -> list[str]:
    return ["const KfGemmArgs& g", *[c_param(m, "e_") for m in pre], "double divisor", "float eps", "float* st_a",
            "float* st_b", *[c_param(m, "r_") for m in row or []], *[c_param(m, "q_") for m in passed(post)],
            "cudaStream_t stream"]


def cuda_launcher(stem: str, plan: RowPlan, pre: list[Member], row: list[Member] | None, post: list[Member] | None,
                  ) -> str:
    lines = [launcher_head(stem, launch_params(pre, row, post)) + " {", f"  Pre_{stem} pre;",
             *[f"  pre.{m.name} = e_{m.name};" for m in pre], "  pre.N = g.N;",
             "  int err = kf_gemm(g, pre, stream);",
             "  if (err == 0) err = kf_row_stats<%d>(pre.out0, g.M, g.N, divisor, eps, st_a, st_b, stream);"
             % STAT_ID[plan.red.op]]
    if row is not None:
        lines += [f"  Row_{stem} row;", *[f"  row.{m.name} = r_{m.name};" for m in row], "  row.N = 1;",
                  "  if (err == 0) err = kf_rows(g.M, st_a, row, stream);"]
    if post is not None:
        lines += [f"  Post_{stem} post;", *[f"  post.{m.name} = q_{m.name};" for m in passed(post)],
                  "  post.st_a = st_a;", "  post.st_b = st_b;", "  post.N = g.N;",
                  "  if (err == 0) err = kf_rows_apply(pre.out0, g.M, g.N, post, stream);"]
    return "\n".join([*lines, "  return err;", "}"]) + "\n"


def row_args(row: list[Member] | None) -> list[str]:
    """What the bound function passes for the row functor's members: its rt[i] outputs, the inputs r_<name>."""
    return [f"rt[{m.name[3:]}].data_ptr<float>()" if m.kind == "out" else cpp_arg(m, "r_") for m in row or []]


def post_args(plan: RowPlan, post: list[Member] | None) -> list[str]:
    """... and for the post functor's (the statistics excepted: norms.functor_args)."""
    return functor_args(passed(post), plan.stored, plan.saved, plan.rows, plan.row_read)


def output_tensors(plan: RowPlan) -> list[str]:
    """The region's outputs in its order, as the bound function's st (pre), lt (post) and rt (per-row) tensors."""
    def tensor(v: str) -> str:
        role = plan.roles[v]
        return (f"st[{plan.stored.index(v)}]" if role == "pre" else f"lt[{plan.late.index(v)}]" if role == "post"
                else f"rt[{plan.rows.index(v)}]")

    return [tensor(v) for v in plan.outputs]


def cpp_function(stem: str, plan: RowPlan, pre: list[Member], row: list[Member] | None,
                 post: list[Member] | None) -> str:
    """`kf_<stem>`: allocations, the CUDA launcher's call; returns the outputs in region order, then z."""
    params = [*[cpp_param(m, "e_") for m in inputs(pre)], "double divisor", "double eps",
              *[cpp_param(m, "r_") for m in inputs(row or [])], *[cpp_param(m, "q_") for m in inputs(post or [])]]
    lines = [*bound_opening(stem, launch_params(pre, row, post), params),
             f"  torch::Tensor st[{len(plan.stored)}], rt[{max(1, len(plan.rows))}], lt[{max(1, len(plan.late))}];",
             "  for (auto& t : st) t = torch::empty({g.M, g.N}, options);",
             f"  for (int i = 0; i < {len(plan.rows)}; ++i) rt[i] = torch::empty({{g.M}}, options);",
             f"  for (int i = 0; i < {len(plan.late)}; ++i) lt[i] = torch::empty({{g.M, g.N}}, options);",
             "  torch::Tensor stats = torch::empty({2, g.M}, options);",
             "  torch::Tensor z = store_z ? torch::empty({g.M, g.N}, options) : torch::Tensor();"]
    args = []
    for m in pre:
        args.append(f"st[{m.name[3:]}].data_ptr<float>()" if m.kind == "out" else
                    "store_z ? z.data_ptr<float>() : nullptr" if m.kind == "z" else cpp_arg(m, "e_"))
    args += ["divisor", "static_cast<float>(eps)", "stats.data_ptr<float>()", "stats.data_ptr<float>() + g.M"]
    args += row_args(row) + post_args(plan, post)
    return "\n".join(lines + launch_and_return(stem, args, output_tensors(plan))) + "\n"


def python_launcher(region: Region, g: Graph, stem: str, plan: RowPlan, names: list[str]) -> str:
    shapes = {n.name: n.shape for n in region.nodes}
    n_out = len(region.outputs)
    red = plan.red
    rets = [f"got[{i}].reshape(x2.shape[0]{''.join(', ' + str(d) for d in shapes[v][1:])}).to(x.dtype)"
            for i, v in enumerate(region.outputs)]
    doc = (f"Fused: {', '.join(n.origin for n in region.nodes)}: the CUDA function `{bound_name(stem)}` of CUDA_SRC "
           f"(the GEMM with Pre_{stem}, the row statistics of {red.origin}, then the per-row and full-width passes). "
           f"{gemm_cost(region, g)} save_z: also return z = x W^T + b (kept for backward).")
    body = ["ext = cuda_module()",
            "x2 = x.reshape(-1, x.shape[-1])",
            f"ops, scheme = gemm_operands(ext, x2, weight, {region.anchor.op == 'matmul'}, GEMM_SCHEME)",
            f"n_out = weight.shape[{1 if region.anchor.op == 'matmul' else 0}]",
            f"divisor = float(n_out) if {red.op == 'mean'} else 1.0",
            f"got = ext.{bound_name(stem)}(*ops, scheme, {', '.join(names)}, save_z)",
            f"outs = [{', '.join(rets)}]",
            "if save_z:",
            f"    return tuple(outs), got[{n_out}].reshape(x2.shape[0], n_out)",
            "return outs[0]" if n_out == 1 else "return tuple(outs)"]
    params = ", ".join(["x", "weight", *[n for n in names if n != "divisor"], "save_z=False"])
    return "\n".join([f"def fused_{stem}({params}):", docstring(doc), *[f"    {ln}" for ln in body]]) + "\n"


def region_code(region: Region, g: Graph, stem: str, classes: set[str]) -> CudaRegion:
    """The CUDA pieces of a GEMM -> ... -> row reduction or row norm -> ... region."""
    (x,) = region_inputs(region)
    plan = row_plan(region, g)
    pre_src, pre = gemm_struct(region, plan.pre, plan.stored, plan.red, f"Pre_{stem}")
    parts, row, post = [pre_src], None, None
    if plan.rows:
        src, row = row_struct(plan.red, plan.row, plan.rows, f"Row_{stem}")
        parts.append(src)
    if plan.post:
        src, post = post_struct(plan, f"Post_{stem}")
        parts.append(src)
    cu = "\n".join([*parts, cuda_launcher(stem, plan, pre, row, post)])
    cpp = cpp_function(stem, plan, pre, row, post)
    e = [f"e_{m.name}" for m in inputs(pre)]
    r = [f"r_{m.name}" for m in inputs(row or [])]
    q = [f"q_{m.name}" for m in inputs(post or [])]
    cls = class_name(stem, classes)
    values = [*[m.value for m in inputs(pre)], _eps(plan.red), *[m.value for m in inputs(row or [])],
              *[m.value for m in inputs(post or [])]]
    python = python_launcher(region, g, stem, plan, [*e, "divisor", "eps", *r, *q]) + "\n\n" + \
        function_source(region, stem, cls, values)
    forward = (f"{', '.join(region.outputs)} = {cls}.run(self, {x})",)
    return CudaRegion(bound_name(stem), cu, cpp, python, forward, ("rows",))
