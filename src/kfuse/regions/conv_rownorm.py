"""Region kind `conv_rownorm`: convolution -> pointwise ops -> a norm over rows of trailing elements of its output ->
pointwise ops, the convolution on kernels/conv.py's tile (or kernels/conv_transpose.py's stride phases). The norms:
LayerNorm over trailing dims (the last W pixels of each channel row for normalized_shape (W,), (H, W), ..., whole
samples for (C, D, H, W)); softmax / log_softmax over the last dim of a view that flattens trailing dims, viewed back
to the output's shape (`x.view(b, c, -1).softmax(2).view(b, c, d, h, w)`: over each channel's pixels; one node after
rewrite.py's softmax-rows), or over W.

A row is L contiguous elements of the NC(D)HW output (L = prod(normalized_shape), or the flattened dims), and a row of
W pixels of one channel is spread over the conv tile's rows (and over a transposed convolution's stride phases), so no
tile holds a row: three launches (kernels/conv_norm.py):
  1. `<name>_conv_kernel`: the convolution and the ops before the norm; stores y (the norm's input) and the region
     outputs before it;
  2. the row statistics: `conv_ln_moments` (mean and 1/sqrt(var + eps), chunk moments merged in float64) or
     `conv_softmax_stats` (max and sum of exp(y - max), the running sum rescaled in float64);
  3. `<name>_apply_kernel`: one pass over y in the convolution's (pixels, channels) layout, so the ops after the
     norm read per-channel parameters as the convolution's epilogue does: the norm at each element's row (its flat
     offset // L; a LayerNorm's affine at its place in the row, offset % L), then the ops after the norm; with a
     windowed pool after them (nothing from the norm on read outside the region), in the pool's rows instead
     (regions/pool_pass.py): the norm and those ops at each window position, max / sum, the ops after the pool.
eps is read from the module when ModelNew runs.
Bytes beyond the convolution: y written once and read twice, 8 bytes a row, the outputs written once; torch would
write the conv's output, read it and write the norm's, then read and write it again for each op after the norm.
Backward: the region recomputed in float64 torch (the norm by its own call) and differentiated, as the convolution
kinds do.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Param, Region, Scalar
from kfuse.ops import CONV_OPS
from kfuse.regions.common import KernelArgs, RegionCode, call, ident, launcher, operand_code, pointwise_lines, var
from kfuse.regions.conv_common import (
    TRANSPOSED,
    NormParts,
    conv_bias,
    conv_cost,
    conv_kernel,
    depthwise,
    form_of,
    geometry_code,
    has_twin,
    pixel_kernel,
    pixel_launch,
    pool_code,
    reads_outside,
    stores,
    tuned_launch,
)
from kfuse.regions.kind import Walk, numel
from kfuse.regions.pool_pass import (
    POOL_PARAMS,
    NormThenPool,
    stored_pool_kernel,
    stored_pool_launch,
)

NORM = "layer_norm"
SOFTMAXES = ("softmax", "log_softmax")  # over W, the output's last dim
ROWS = ("softmax_rows", "log_softmax_rows")  # over its last `dims` dims (rewrite.py's softmax-rows)
ROW_OPS = (NORM, *SOFTMAXES, *ROWS)
NORMS = (*ROW_OPS, "group_norm", "instance_norm", "batch_norm")  # one norm a region: the walk's first
# per row op: the statistics' names in the kernels, and the launcher's call that computes them from y
STATS = {NORM: ("ln_mean", "ln_rstd", "conv_ln_moments({y}, norm_length, norm_eps)"),
         "softmax": ("row_max", "row_sum", "conv_softmax_stats({y}, norm_length)"),
         "log_softmax": ("row_max", "row_sum", "conv_softmax_stats({y}, norm_length)")}
STATS.update({rows: STATS[op] for rows, op in zip(ROWS, SOFTMAXES)})
# the norm of y from its row's statistics a, b (before a LayerNorm's affine)
FORMULA = {NORM: "({y} - {a}) * {b}", "softmax": "tl.exp({y} - {a}) / {b}",
           "log_softmax": "{y} - {a} - tl.log({b})"}
FORMULA.update({rows: FORMULA[op] for rows, op in zip(ROWS, SOFTMAXES)})


def conv_pass(region: Region, stem: str, doc: str, p: NormParts,
              registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Pass 1: the convolution and the ops before the norm; y and the region outputs before the norm stored."""
    args, env = KernelArgs(registry), {}
    body = conv_bias(region.anchor, env, args) + pointwise_lines(p.before, env, args) + stores(p.stored, env)
    return conv_kernel(form_of(region.anchor), f"{stem}_conv", doc, [f"buf_{v}" for v in p.stored], args, body,
                       sm90=True), args


def affine(args: KernelArgs, out: str, weight: Param | None, bias: Param | None) -> tuple[list[str], list[str]]:
    """(loads, lines) of the norm's weight and bias, each read at the element's place in its row (`ln_col`)."""
    loads, lines = [], []
    for a, neutral, op in ((weight, "1.0", "*"), (bias, "0.0", "+")):
        if a is not None:
            name = args.add("p_" + ident(a.path), f"as_vector({a.expr()})", True)
            loads.append(f"{name} = tl.load({name}_ptr + ln_col, mask=mask, other={neutral})")
            lines.append(f"{out} = {out} {op} {name}")
    return loads, lines


def normalized(p: NormParts, args: KernelArgs, env: dict[str, str], y: str, offs: str,
               mask: str) -> tuple[list[str], list[str]]:
    """(loads, lines): the norm of `y` at flat offsets `offs` (each element's row offs // L, its place offs % L)
    under `mask`, then the ops between the norm and the pool (or the end)."""
    out, op = var(p.norm.name), p.norm.op
    st_a, st_b, _ = STATS[op]
    loads, scaled = affine(args, out, p.norm.args[1], p.norm.args[2]) if op == NORM else ([], [])
    stats = [f"row = {offs} // L  # the element's row: L contiguous elements",
             *([f"ln_col = {offs} % L"] if loads else []),
             f"{st_a} = tl.load({st_a}_ptr + row, mask={mask}, other=0.0)",
             f"{st_b} = tl.load({st_b}_ptr + row, mask={mask}, other=1.0)"]
    env[p.norm.name] = out
    lines = [f"{out} = {FORMULA[op].format(y=y, a=st_a, b=st_b)}  # {p.norm.origin}", *scaled,
             *pointwise_lines(p.after, env, args)]
    return stats + loads, lines


def apply_pass(region: Region, stem: str, doc: str, p: NormParts,
               registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Pass 3 over y (NC(D)HW, S pixels a channel plane): the norm at each element's row, its affine and the ops
    after it, as the convolution's (pixels, channels) tiles; with a windowed pool after them, in the pool's rows
    (pool_pass.py), the norm applied at each window position before max / sum."""
    args, env = KernelArgs(registry), {p.y: "v_y" if p.pool is None else "y"}
    extra = ([f"{STATS[p.norm.op][0]}_ptr", f"{STATS[p.norm.op][1]}_ptr"], ["L"])
    if p.pool is not None:
        setup = ["y_offs = plane * (OD * OH * OW) + pixel  # the window position's flat offsets in y",
                 "y_mask = valid[:, None] & mask_n[None, :]"]
        loads, lines = normalized(p, args, env, "y", "y_offs", "y_mask")
        outs = {f"buf_{v}": v for v in p.post_outs}
        return stored_pool_kernel(f"{stem}_apply_kernel", doc, p.pool, p.post, outs, args, env,
                                  ([], [*setup, *loads, *lines]), extra), args
    loads, lines = normalized(p, args, env, "v_y", "out_offs", "mask")
    body = ["v_y = tl.load(y_ptr + out_offs, mask=mask, other=0.0).to(tl.float32)", *loads, *args.loads, *lines,
            *stores(p.post_outs, env)]
    pointers = ["y_ptr", *[f"buf_{o}_ptr" for o in p.post_outs], *extra[0]]
    return pixel_kernel(f"{stem}_apply_kernel", doc, pointers, args, tuple(extra[1]), body), args


def launcher_lines(region: Region, stem: str, p: NormParts, a1: KernelArgs, a3: KernelArgs,
                   sm90: bool = False) -> list[str]:
    form = form_of(region.anchor)
    st_a, st_b, stats_call = STATS[p.norm.op]

    def empty(v: str, dtype: str = "x.dtype") -> str:
        return f"buf_{v} = torch.empty(geo.out_shape, device=x.device, dtype={dtype})"

    y_dtype = "x.dtype" if p.y in region.outputs else "torch.float32"  # y stays fp32 when only the later passes read it
    outs = [f"buf_{v}" for v in p.post_outs]
    if p.pool is not None:
        apply = stored_pool_launch(f"{stem}_apply_kernel", f"buf_{p.y}", outs, a3, ([st_a, st_b], ["norm_length"]))
    else:
        apply = [*[empty(v) for v in p.post_outs],
                 *pixel_launch(f"{stem}_apply_kernel", [f"buf_{p.y}", *outs, st_a, st_b, *a3.params], ["norm_length"])]
    check = []
    if p.norm.op == NORM:
        check = ["if tuple(geo.out_shape[-row_dims:]) != tuple(norm_shape):  # torch's LayerNorm check",
                 "    raise RuntimeError(f'LayerNorm: normalized_shape {list(norm_shape)} is not the last dims '",
                 "                       f'of the convolution output of size {list(geo.out_shape)}')"]
    return [*form.head(sm90),
            "N, C = geo.out_shape[0], geo.C_out",
            "S = torch.Size(geo.out_shape[2:]).numel()  # pixels a channel plane",
            *check,
            "norm_length = torch.Size(geo.out_shape[-row_dims:]).numel()  # a row's elements: the last row_dims dims",
            empty(p.y, y_dtype), *[empty(v) for v in p.pre_outs if v != p.y],
            *tuned_launch(form, f"{stem}_conv", [f"buf_{v}" for v in p.stored], a1, [], [], sm90=sm90),
            f"{st_a}, {st_b} = {stats_call.format(y=f'buf_{p.y}')}",
            *apply,
            f"return {', '.join(f'buf_{v}' for v in region.outputs)}"]


def row_dims(norm: Node) -> int:
    """How many of the output's trailing dims a row spans: normalized_shape's, the softmax-rows rewrite's, or W."""
    if norm.op == NORM:
        return len(norm.attrs["normalized_shape"])
    return int(norm.attrs.get("dims", 1))


def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    anchor, p = region.anchor, NormParts(region, ROW_OPS)
    dims = row_dims(p.norm)
    registry: dict[str, tuple[str, bool]] = {}
    replaced = ", ".join(n.origin for n in region.nodes)
    conv, a1 = conv_pass(region, stem, f"Pass 1 of: {replaced}. {conv_cost(anchor, g, len(p.stored))}", p, registry)
    apply, a3 = apply_pass(region, stem, f"Pass 3 of: {replaced}.", p, registry)
    params = [n for n, _ in registry.values()]
    form = form_of(anchor)
    pooled = p.pool is not None
    length = numel(anchor.shape[-dims:])
    src = launcher(f"fused_{stem}", ["x", "weight", "row_dims", "norm_shape", "norm_eps", *params, *form.geometry,
                                     *(POOL_PARAMS if pooled else [])],
                   launcher_lines(region, stem, p, a1, a3, has_twin(conv, f"{stem}_conv")),
                   f"Fused: {replaced}. Statistics per row of {length} elements (the last {dims} "
                   f"dim{'s' if dims > 1 else ''}), merged in float64.")
    shape, eps_code = "None", "0.0"
    if p.norm.op == NORM:
        eps = p.norm.args[3]  # the module's, read when ModelNew runs; F.layer_norm's number as written
        shape = str(tuple(p.norm.attrs["normalized_shape"]))
        eps_code = f"float({eps.expr() if isinstance(eps, Scalar) else repr(float(eps))})"
    call_args = [anchor.args[0], operand_code(anchor.args[1]), str(dims), shape, eps_code, *registry,
                 *geometry_code(anchor), *(pool_code(p.pool) if pooled else [])]
    return RegionCode((conv, apply), src, (f"{', '.join(region.outputs)} = {call(f'fused_{stem}', call_args)}",))


def trailing(n: Node, shape: tuple[int, ...]) -> bool:
    """normalized_shape is the output's last k dims, 1 <= k < rank (never the batch), the affine of that shape."""
    norm = tuple(n.attrs.get("normalized_shape", ()))
    if not 1 <= len(norm) < len(shape) or tuple(shape[-len(norm):]) != norm:
        return False
    return all(a is None or (isinstance(a, Param) and tuple(a.shape) == norm) for a in n.args[1:3])


def row_op_after_conv(walk: Walk, n: Node) -> bool:
    """The walk's first norm, over rows of a convolution's whole output: a LayerNorm over trailing dims, a softmax /
    log_softmax over W, or over rows of trailing dims (rewrite.py's softmax-rows: a view, the softmax over its last
    dim, a view back)."""
    anchor, g = walk.anchor, walk.g
    if anchor.op not in (*CONV_OPS, TRANSPOSED) or (anchor.op in CONV_OPS and depthwise(anchor)):
        return False  # the direct depthwise tile has no tuned plan here; the other kinds refuse it too
    if (n.op not in ROW_OPS or n.shape != anchor.shape or any(m.op in NORMS for m in walk.members) or not n.args
            or not isinstance(n.args[0], str) or n.args[0] not in walk.values or g.shape_of(n.args[0]) != anchor.shape):
        return False
    if n.op == NORM:
        return len(n.args) == 4 and trailing(n, anchor.shape)
    return n.op in ROWS or n.attrs.get("dim") in (-1, len(n.shape) - 1)


class ConvRowNorm(NormThenPool):
    name = "conv_rownorm"
    family = "conv"
    kernel_modules = ("conv", "conv_transpose", "conv_norm")
    at_ops = ROW_OPS

    def enters(self, walk: Walk, n: Node) -> bool:
        return row_op_after_conv(walk, n) and not reads_outside(walk)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return generate(region, g, stem)


KIND = ConvRowNorm()
