"""A region's epilogue as a CUDA C++ functor, spelled from the one op table (kfuse/ops.py, each row's `cuda`).

The GEMM kernels (gemm_source.py) call it once per stored element, with the element's fp32 accumulator already
unscaled: `epi(col, m, n, acc)`; `col = epi.column(n)` holds what the column reads (per-column parameters, loaded
once per column and lane). For `gemm -> mul -> leaky_relu`:

    struct Epi_linear_mul_leaky_relu {
      float* out0;                       // (M, N) outputs, one per value read after the region
      float* z;                          // x W^T + b for backward, or nullptr
      const float* p_gemm_bias;          // per-column (N,) or one-element parameters
      float s_multiplier;                // numbers, read from the module at call time
      float s_leaky_relu_negative_slope;
      long long N;
      struct Col { float p_gemm_bias; };
      __device__ __forceinline__ Col column(long long n) const { ... }
      __device__ __forceinline__ void operator()(const Col& c, long long m, long long n, float acc) const {
        const long long at = m * N + n;
        const float v_gemm = acc + c.p_gemm_bias;  // bias of nn.Linear gemm
        if (z != nullptr) z[at] = v_gemm;
        const float v_mul = v_gemm * s_multiplier;  // operator.mul
        ...
        out0[at] = v_leaky_relu;
      }
    };

Operands are always plain names (members, the Col's fields, earlier values), as the table's spellings expect.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kfuse.cuda.glue import Member
from kfuse.ir import Arg, Node, Param, Region, Scalar
from kfuse.ops import POINTWISE, VIEW_OPS
from kfuse.regions.common import ident, is_single, var


@dataclass
class EpilogueArgs:
    """The struct's input members, each fed by one launcher expression (one member per distinct expression)."""

    members: list[Member] = field(default_factory=list)

    def add(self, stem: str, value: str, kind: str) -> str:
        for m in self.members:
            if m.value == value:
                return m.name
        taken = {m.name for m in self.members}
        name = stem if stem not in taken else f"{stem}_{len(taken)}"
        self.members.append(Member(name, kind, value))
        return name

    def operand(self, a: Arg, env: dict[str, str]) -> str:
        """A pointwise op's operand in the functor: an earlier value, a scalar member or a column field."""
        if isinstance(a, str):
            return env[a]
        if isinstance(a, Scalar):
            stem = "s_" + (ident(a.attr) if a.attr else f"c{len(self.members)}")
            return self.add(stem, f"float({a.expr()})", "scalar")
        if isinstance(a, Param):
            kind = "single" if is_single(a) else "vector"
            return "c." + self.add("p_" + ident(a.path), f"as_vector({a.expr()})", kind)
        raise ValueError(f"operand {a!r} cannot be used in a fused CUDA epilogue")


def cuda_expr(op: str, operands: list[str]) -> str:
    """The table's CUDA spelling of `op` over plain-name operands."""
    spec = POINTWISE["identity" if op in VIEW_OPS else op]
    if not spec.cuda:
        raise ValueError(f"op {op} has no CUDA spelling in kfuse/ops.py")
    return spec.cuda.format(*operands)


def bias_of(anchor: Node) -> Arg:
    return anchor.args[2] if anchor.op == "linear" and len(anchor.args) > 2 else None


def chain_lines(nodes, env: dict[str, str], args: EpilogueArgs) -> list[str]:
    """One line per pointwise op (views are the identity), each value a `const float` named by kfuse's `var`."""
    lines = []
    for n in nodes:
        operands = [args.operand(a, env) for a in n.args]
        lines.append(f"const float {var(n.name)} = {cuda_expr(n.op, operands)};  // {n.origin}")
        env[n.name] = var(n.name)
    return lines


def body_lines(region: Region, args: EpilogueArgs, nodes=None, stores=None) -> list[str]:
    """The GEMM functor's body: the bias, z's store, each op of `nodes` (default: the whole chain), the stores
    of `stores` (default: region.outputs) into out0, out1, ..."""
    anchor = region.anchor
    env = {anchor.name: var(anchor.name)}
    bias = bias_of(anchor)
    if bias is None:
        lines = [f"const float {var(anchor.name)} = acc;  // {anchor.origin}"]
    else:
        lines = [f"const float {var(anchor.name)} = acc + {args.operand(bias, env)};  // bias of {anchor.origin}"]
    lines.append(f"if (z != nullptr) z[at] = {var(anchor.name)};  // z = x W^T + b, kept for backward")
    lines += chain_lines(region.nodes[1:] if nodes is None else nodes, env, args)
    return lines + [f"out{i}[at] = {env[v]};" for i, v in enumerate(region.outputs if stores is None else stores)]


def functor_struct(struct: str, doc: str, members: list[Member], args: EpilogueArgs, body: list[str],
                   at: str = "m * N + n", sizes: tuple[str, ...] = ("N",)) -> str:
    """The C++ functor: `members` (outputs, z, saved values), then the inputs in `args`, the `sizes` (long long),
    the per-column Col and `operator()(c, m, n, acc)` running `body` at the element `at` (a GEMM's (M, N) output:
    m * N + n)."""
    columns = [m for m in args.members if m.kind in ("vector", "single")]
    fields = " ".join(f"float {m.name};" for m in columns)
    loads = "".join(f" c.{m.name} = {m.name}[{'n' if m.kind == 'vector' else '0'}];" for m in columns)
    lines = [f"// {doc}",
             f"struct {struct} {{",
             *[f"  {m.c_type} {m.name};" for m in [*members, *args.members]],
             *[f"  long long {size};" for size in sizes],
             f"  struct Col {{{(' ' + fields + ' ') if fields else ''}}};",
             "  __device__ __forceinline__ Col column(long long n) const {",
             f"    Col c;{loads}",
             "    return c;",
             "  }",
             "  __device__ __forceinline__ void operator()(const Col& c, long long m, long long n, float acc) const {",
             f"    const long long at = {at};",
             *[f"    {ln}" for ln in body],
             "  }",
             "};"]
    return "\n".join(lines) + "\n"


def epilogue_struct(region: Region, struct: str) -> tuple[str, list[Member]]:
    """The functor's C++ source and its members in order (outputs, z, then the inputs it reads)."""
    args = EpilogueArgs()
    body = body_lines(region, args)
    members = [*[Member(f"out{i}", "out") for i in range(len(region.outputs))], Member("z", "z")]
    doc = "The epilogue of " + " -> ".join(n.origin for n in region.nodes) + ", on one element of the GEMM's fp32 " \
        "accumulator."
    return functor_struct(struct, doc, members, args, body), [*members, *args.members]
