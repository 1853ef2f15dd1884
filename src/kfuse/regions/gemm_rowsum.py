"""Region kind `gemm_rowsum`: the sum (or mean) over the features of a GEMM, rewritten to a GEMV, plus the
per-row ops after it.

rewrite.py's `sum-of-gemm->gemv` turns sum_n (x W^T + b)[m, n] into x[m, :] . w_sum + b_sum with
w_sum = sum of W's rows (K,) and b_sum = sum(b): exact in real arithmetic. The launcher forms w_sum and b_sum
in float64 (one read of W, N * K * 4 bytes) and keeps them on the weight until W or b changes
(runtime.cached_gemv_sums: storage and version counter, so never stale); the kernel reads x once
(M * K * 4 bytes) and does 2 * M * K flops instead of the GEMM's 2 * M * N * K. Memory-bound, so it accumulates
in float64 for free: the sum comes out correctly rounded, never less accurate than eager's GEMM + fp32 sum
(which matters most where one row's sum is the whole output). The ops after the sum run on the (M,) result
in float64 in the same kernel, rounded to the output's dtype once, when stored.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Param, Region
from kfuse.ops import VIEW_OPS
from kfuse.regions.common import KernelArgs, RegionCode, call, launcher, names, pointwise_lines, var
from kfuse.regions.kind import RegionKind, Walk, numel, per_row_operand, pointwise_with
from kfuse.regions.rowstats import as_pointwise, shape_expr


def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    nodes = list(region.nodes)
    anchor = nodes[0]
    x, weight, bias = anchor.args
    kn, mean = anchor.attrs.get("kn", False), anchor.attrs.get("mean", False)
    name = stem
    args = KernelArgs()
    env = {anchor.name: var(anchor.name)}
    # the per-row ops run in float64 too (M values: free) and round once, at the store
    body = [f"{var(anchor.name)} = (acc + bsum){' / N' if mean else ''}  # {anchor.origin}"]
    body += pointwise_lines(as_pointwise(nodes[1:]), env, args)
    outs = [f"o_{v}" for v in region.outputs]
    body += [f"tl.store(o_{v}_ptr + offs_m, {env[v]}, mask=mask_m)" for v in region.outputs]
    replaced = ", ".join(n.origin for n in nodes)
    kernel = "\n".join([
        "@triton.jit",
        "def " + call(f"{name}_kernel", ["x_ptr", "w_ptr", *[f"{o}_ptr" for o in outs]], names(args.decls()),
                      ["M", "N", "K", "stride_xm", "stride_xk", "bsum_ptr", "BLOCK_M: tl.constexpr",
                       "BLOCK_K: tl.constexpr"]) + ":",
        f'    """Fused: {replaced}. Row m: x[m, :] . w_sum + b_sum, then the per-row ops."""',
        "    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    mask_m = offs_m < M",
        "    acc = tl.zeros((BLOCK_M,), dtype=tl.float64)",
        "    for k0 in range(0, K, BLOCK_K):",
        "        offs_k = k0 + tl.arange(0, BLOCK_K)",
        "        mask_k = offs_k < K",
        "        xt = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :] * stride_xk,",
        "                     mask=mask_m[:, None] & mask_k[None, :], other=0.0).to(tl.float64)",
        "        wt = tl.load(w_ptr + offs_k, mask=mask_k, other=0.0)",
        "        acc += tl.sum(xt * wt[None, :], axis=1)",
        "    bsum = tl.load(bsum_ptr)",
        *[f"    {ln}" for ln in args.loads + body]]) + "\n"
    lines = ["x2 = x.reshape(-1, x.shape[-1])",
             "M, K = x2.shape",
             f"N = weight.shape[{1 if kn else 0}]",
             f"w_sum, bsum = cached_gemv_sums(weight, bias, {kn})  # recomputed only when W or b changes",
             *[f"{o} = torch.empty((M,), device=x.device, dtype=x.dtype)" for o in outs],
             "bm, bk = (32, 128) if interpreting() else (64, 128)",
             call(f"{name}_kernel[(cdiv(M, bm),)]", ["x2", "w_sum", *outs, *args.params, "M", "N", "K",
                                                     "x2.stride(0)", "x2.stride(1)", "bsum", "BLOCK_M=bm", "BLOCK_K=bk",
                                                     "num_warps=4"]),
             "return " + ", ".join(f"o_{v}.reshape({shape_expr(n, False)})" for v in region.outputs
                                   for n in nodes if n.name == v)]
    launch = launcher(f"fused_{name}", ["x", "weight", "bias", *args.params], lines, f"Fused: {replaced}.")
    w: Param = weight
    call_args = [x, w.expr(), bias.expr() if isinstance(bias, Param) else "None", *args.values]
    return RegionCode((kernel,), launch, (f"{', '.join(region.outputs)} = " + call(f"fused_{name}", call_args),))


class GemmRowSum(RegionKind):
    name = "gemm_rowsum"
    family = "gemm"
    at_ops = ("linear_rowsum",)

    def starts(self, n: Node, g: Graph) -> bool:
        """rewrite.py's `linear_rowsum` node over a 2-d x."""
        return n.op == "linear_rowsum" and isinstance(n.args[0], str) and len(g.shape_of(n.args[0])) == 2

    def joins(self, walk: Walk, n: Node) -> bool:
        """The per-row ops (and views) after the row sum."""
        vals = n.value_args()
        if not vals or not all(v in walk.values for v in vals) or numel(n.shape) != numel(walk.anchor.shape):
            return False
        return n.op in VIEW_OPS or pointwise_with(n, per_row_operand)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return generate(region, g, stem)


KIND = GemmRowSum()
