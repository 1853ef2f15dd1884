"""The CUDA code of the row-sum kind: the sum (or mean) over a GEMM's features, rewritten to a GEMV by
rewrite.py's `sum-of-gemm->gemv` (x[m, :] . w_sum + b_sum, exact in real arithmetic), and the per-row ops after it.

The launcher forms w_sum (W's rows summed, (K,)) and b_sum in float64, kept on the weight and the bias until either
changes (runtime.cached_on: storage and version counter). `kf_row_dot_kernel` (rows_source.py): one warp per row
of x, float64 FMAs over K in lane-strided order, a butterfly, + b_sum (/ N for a mean), rounded to fp32 once, then
the region's functor (`Row_<stem>`: the per-row ops, reading numbers and one-element parameters) at (m, 0).
Memory-bound: x read once (4 M K bytes), 2 M K flops instead of the GEMM's 2 M N K; the float64 sum never loses to
eager's GEMM and fp32 sum (the Triton twin does the same in a Triton kernel). Autograd: CudaRecomputeFn, the region
recomputed in float64 torch.
"""

from __future__ import annotations

from kfuse.backward import class_name, region_inputs
from kfuse.cuda.epilogue import CudaRegion, recompute_function_source
from kfuse.cuda.glue import Member, bound_name, c_param, cpp_param, inputs, launcher_head
from kfuse.cuda.spellings import EpilogueArgs, chain_lines, functor_struct
from kfuse.ir import Graph, Param, Region
from kfuse.regions.common import docstring, var


def row_struct(region: Region, struct: str) -> tuple[str, list[Member]]:
    """The functor: acc is the row sum (or mean); the per-row ops; each output stored at m (N = 1)."""
    anchor = region.anchor
    args = EpilogueArgs()
    env = {anchor.name: var(anchor.name)}
    body = [f"const float {var(anchor.name)} = acc;  // {anchor.origin}"]
    body += chain_lines(region.nodes[1:], env, args)
    body += [f"out{i}[at] = {env[v]};" for i, v in enumerate(region.outputs)]
    members = [Member(f"out{i}", "out") for i in range(len(region.outputs))]
    doc = "The row sum's per-row ops: " + (" -> ".join(n.origin for n in region.nodes[1:]) or "none") + "."
    return functor_struct(struct, doc, members, args, body), [*members, *args.members]


def sources(stem: str, struct: str, members: list[Member]) -> tuple[str, str]:
    """The CUDA launcher and the bound C++ function `kf_<stem>(x, w_sum, b_sum, divisor, inputs...)`."""
    function = bound_name(stem)
    outs = [m for m in members if m.kind == "out"]
    sets = "\n".join(f"  post.{m.name} = {m.name};" for m in members)
    head = launcher_head(stem, ["const float* x", "long long M", "long long K", "const double* w",
                                "const double* bsum", "double divisor", *[c_param(m) for m in members],
                                "cudaStream_t stream"])
    cu = f"{head} {{\n  {struct} post;\n{sets}\n  post.N = 1;\n  return kf_row_dot(x, M, K, w, bsum, divisor, " \
         "post, stream);\n}\n"
    tensors = "".join(", " + cpp_param(m) for m in inputs(members))
    args = [f"{m.name}.data_ptr<float>()" for m in outs]
    args += [f'kf_vector({m.name}, 1, "{m.name}", x)' if m.kind in ("vector", "single")  # per-row: one element
             else f"static_cast<float>({m.name})" for m in inputs(members)]
    lines = [f"{head};", "",
             f"std::vector<torch::Tensor> {function}(torch::Tensor x, torch::Tensor w, torch::Tensor bsum, "
             f"double divisor{tensors}) {{",
             '  kf_expect(x, "x", torch::kFloat32, 2, x);',
             '  kf_expect(w, "the weight\'s row sums", torch::kFloat64, 1, x);',
             '  kf_expect(bsum, "the bias\'s sum", torch::kFloat64, 1, x);',
             '  TORCH_CHECK(w.size(0) == x.size(1) && bsum.size(0) == 1, "kfuse: row sum operands of other sizes");',
             "  const c10::cuda::CUDAGuard guard(x.device());",
             *[f"  torch::Tensor {m.name} = torch::empty({{x.size(0)}}, x.options());" for m in outs],
             f"  kf_check(kf_launch_{stem}(x.data_ptr<float>(), x.size(0), x.size(1), w.data_ptr<double>(), "
             f"bsum.data_ptr<double>(), divisor, {', '.join(args)}, c10::cuda::getCurrentCUDAStream()),",
             f'           "{function}");',
             f"  return {{{', '.join(m.name for m in outs)}}};",
             "}"]
    return cu, "\n".join(lines) + "\n"


def python_source(region: Region, stem: str, cls: str, members: list[Member]) -> str:
    """`fused_<stem>(x, weight, bias, inputs...)` and the region's CudaRecomputeFn."""
    anchor = region.anchor
    x, weight, bias = anchor.args
    kn, mean = anchor.attrs.get("kn", False), anchor.attrs.get("mean", False)
    fed = inputs(members)
    shapes = {n.name: n.shape for n in region.nodes}
    rets = [f"got[{i}].reshape(x2.shape[0]{''.join(', ' + str(d) for d in shapes[v][1:])})"
            for i, v in enumerate(region.outputs)]
    replaced = " -> ".join(n.origin for n in region.nodes)
    body = ["ext = cuda_module()",
            "x2 = x.reshape(-1, x.shape[-1]).float().contiguous()",
            f"w_sum = cached_on(weight, ('row_sum', {kn}), lambda: weight_nk(weight, {kn}).double().sum(0))",
            "b_sum = (x2.new_zeros(1, dtype=torch.float64) if bias is None else",
            "         cached_on(bias, 'sum', lambda: bias.detach().double().sum().reshape(1)))",
            f"divisor = float(weight.shape[{1 if kn else 0}]) if {mean} else 1.0",
            f"got = ext.{bound_name(stem)}(x2, w_sum, b_sum, divisor{''.join(', ' + m.name for m in fed)})",
            f"return {', '.join(rets)}"]
    doc = (f"Fused: {replaced}: the CUDA function `{bound_name(stem)}` (kf_row_dot_kernel with Row_{stem}): each row "
           "of x times W's row sums, in float64, then the per-row ops.")
    params = ", ".join(["x", "weight", "bias", *[m.name for m in fed]])
    launcher = "\n".join([f"def fused_{stem}({params}):", docstring(doc), *[f"    {ln}" for ln in body]]) + "\n"
    values = [m.value for m in fed]
    bias_expr = bias.expr() if isinstance(bias, Param) else "None"
    launch = f"return fused_{stem}(x, {weight.expr()}, {bias_expr}{''.join(', ' + v for v in values)})"
    return launcher + "\n\n" + recompute_function_source(region, stem, cls, launch)


def region_code(region: Region, g: Graph, stem: str, classes: set[str]) -> CudaRegion:
    (x,) = region_inputs(region)
    struct = f"Row_{stem}"
    struct_src, members = row_struct(region, struct)
    cu, cpp = sources(stem, struct, members)
    cls = class_name(stem, classes)
    forward = (f"{', '.join(region.outputs)} = {cls}.run(self, {x})",)
    return CudaRegion(bound_name(stem), struct_src + "\n" + cu, cpp, python_source(region, stem, cls, members),
                      forward, ("row_dot",))
