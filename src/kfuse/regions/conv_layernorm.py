"""Region kind `conv_layernorm`: convolution -> pointwise ops -> LayerNorm over trailing dims of its output (the last
W pixels of each channel row for normalized_shape (W,), (H, W), ..., or whole samples for (C, D, H, W)) -> pointwise
ops, the convolution on kernels/conv.py's tile (or kernels/conv_transpose.py's stride phases).

A normalized row is L = prod(normalized_shape) contiguous elements of the NC(D)HW output, and a row of W pixels of one
channel is spread over the conv tile's rows (and over a transposed convolution's stride phases), so no tile holds a
row: three launches (kernels/conv_norm.py):
  1. `<name>_conv_kernel`: the convolution and the ops before the norm; stores y (the norm's input) and the region
     outputs before it;
  2. `conv_ln_moments`: each row's mean and 1/sqrt(var + eps), chunk moments merged in float64;
  3. `<name>_apply_kernel`: one pass over y in the convolution's (pixels, channels) layout, so the ops after the
     norm read per-channel parameters as the convolution's epilogue does: (y - mean) * rstd at each element's row
     (its flat offset // L), the affine at its place in the row (offset % L), then the ops after the norm.
eps is read from the module when ModelNew runs.
Bytes beyond the convolution: y written once and read twice, 8 bytes a row, the outputs written once; torch would
write the conv's output, read it and write the norm's, then read and write it again for each op after the norm.
Backward: the region recomputed in float64 torch (F.layer_norm) and differentiated, as the convolution kinds do.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Param, Region, Scalar
from kfuse.ops import CONV_OPS
from kfuse.regions.common import KernelArgs, RegionCode, call, ident, launcher, operand_code, pointwise_lines, var
from kfuse.regions.conv_common import (
    TRANSPOSED,
    conv_bias,
    conv_cost,
    conv_kernel,
    conv_launch,
    depthwise,
    form_of,
    geometry_code,
    joins_after_norm,
    pixel_kernel,
    reads_outside,
    stores,
)
from kfuse.regions.kind import RegionKind, Walk, numel, same_tile

NORM = "layer_norm"
NORMS = (NORM, "group_norm", "instance_norm", "batch_norm")  # one norm a region: the walk's first


class Parts:
    """The region cut at its LayerNorm: the ops before it, after it, and which region outputs each side stores."""

    def __init__(self, region: Region) -> None:
        self.at, self.norm = next((i, n) for i, n in enumerate(region.nodes) if n.op == NORM)
        self.before, self.after = list(region.nodes[1:self.at]), list(region.nodes[self.at + 1:])
        pre = {n.name for n in region.nodes[:self.at]}
        self.pre_outs = [v for v in region.outputs if v in pre]
        self.post_outs = [v for v in region.outputs if v not in pre]
        self.y = self.norm.args[0]
        self.stored = list(dict.fromkeys([self.y, *self.pre_outs]))  # what pass 1 writes
        self.shape = tuple(self.norm.attrs["normalized_shape"])


def conv_pass(region: Region, stem: str, doc: str, p: Parts,
              registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Pass 1: the convolution and the ops before the norm; y and the region outputs before the norm stored."""
    args, env = KernelArgs(registry), {}
    body = conv_bias(region.anchor, env, args) + pointwise_lines(p.before, env, args) + stores(p.stored, env)
    return conv_kernel(form_of(region.anchor), f"{stem}_conv", doc, [f"buf_{v}" for v in p.stored], args, body), args


def affine(args: KernelArgs, out: str, weight: Param | None, bias: Param | None) -> tuple[list[str], list[str]]:
    """(loads, lines) of the norm's weight and bias, each read at the element's place in its row (`ln_col`)."""
    loads, lines = [], []
    for a, neutral, op in ((weight, "1.0", "*"), (bias, "0.0", "+")):
        if a is not None:
            name = args.add("p_" + ident(a.path), f"as_vector({a.expr()})", True)
            loads.append(f"{name} = tl.load({name}_ptr + ln_col, mask=mask, other={neutral})")
            lines.append(f"{out} = {out} {op} {name}")
    return loads, lines


def apply_pass(region: Region, stem: str, doc: str, p: Parts,
               registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Pass 3: one pass over y (NC(D)HW, S pixels a channel plane) as the convolution's (pixels, channels) tiles:
    each element's row statistics and affine, then the ops after the norm."""
    args, env = KernelArgs(registry), {p.y: "v_y"}
    out = var(p.norm.name)
    loads, scaled = affine(args, out, p.norm.args[1], p.norm.args[2])
    body = [f"{out} = (v_y - ln_mean) * ln_rstd  # {p.norm.origin}", *scaled]
    env[p.norm.name] = out
    body += pointwise_lines(p.after, env, args) + stores(p.post_outs, env)
    lines = ["v_y = tl.load(y_ptr + out_offs, mask=mask, other=0.0).to(tl.float32)",
             "ln_row = out_offs // L  # the normalized row: L contiguous elements",
             "ln_col = out_offs % L",
             "ln_mean = tl.load(ln_mean_ptr + ln_row, mask=mask, other=0.0)",
             "ln_rstd = tl.load(ln_rstd_ptr + ln_row, mask=mask, other=1.0)",
             *loads, *args.loads, *body]
    pointers = ["y_ptr", "ln_mean_ptr", "ln_rstd_ptr", *[f"buf_{o}_ptr" for o in p.post_outs]]
    return pixel_kernel(f"{stem}_apply_kernel", doc, pointers, args, ("L",), lines), args


def launcher_lines(region: Region, stem: str, p: Parts, a1: KernelArgs, a3: KernelArgs) -> list[str]:
    form = form_of(region.anchor)

    def empty(v: str, dtype: str = "x.dtype") -> str:
        return f"buf_{v} = torch.empty(geo.out_shape, device=x.device, dtype={dtype})"

    y_dtype = "x.dtype" if p.y in region.outputs else "torch.float32"  # y stays fp32 when only the later passes read it
    launch = conv_launch(form, f"{stem}_conv", [f"buf_{v}" for v in p.stored], a1)
    return ["x = x.contiguous()",
            f"geo, scheme, cfg, ops, sizes = {form.plan}(x, weight, {', '.join(form.geometry)})",
            "N, C = geo.out_shape[0], geo.C_out",
            "S = torch.Size(geo.out_shape[2:]).numel()  # pixels a channel plane",
            "if tuple(geo.out_shape[-len(norm_shape):]) != tuple(norm_shape):  # torch's LayerNorm check",
            "    raise RuntimeError(f'LayerNorm: normalized_shape {list(norm_shape)} is not the last dims of the '",
            "                       f'convolution output of size {list(geo.out_shape)}')",
            "norm_length = torch.Size(norm_shape).numel()  # a normalized row's elements",
            empty(p.y, y_dtype), *[empty(v) for v in p.pre_outs if v != p.y],
            "def launch(cfg):  # the tile tuned on a GPU's first call at each geometry (kernels/conv.py tuned_conv)",
            *[f"    {ln}" for ln in launch],
            "if geo.M:",
            f"    launch(tuned_conv({stem}_conv_kernel, geo, scheme, cfg, x, launch))",
            f"ln_mean, ln_rstd = conv_ln_moments(buf_{p.y}, norm_length, norm_eps)",
            *[empty(v) for v in p.post_outs],
            "M = N * S",
            "bm, bn_ = (min(triton.next_power_of_2(max(M, 1)), 8192), 64) if interpreting() else (64, 32)",
            "if M:",
            "    " + call(f"{stem}_apply_kernel[(cdiv(M, bm), cdiv(C, bn_))]",
                          [f"buf_{p.y}", "ln_mean", "ln_rstd", *[f"buf_{v}" for v in p.post_outs], *a3.params],
                          ["M", "C", "S", "norm_length", "BLOCK_M=bm", "BLOCK_N=bn_", "num_warps=4"], indent=12),
            f"return {', '.join(f'buf_{v}' for v in region.outputs)}"]


def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    anchor, p = region.anchor, Parts(region)
    registry: dict[str, tuple[str, bool]] = {}
    replaced = ", ".join(n.origin for n in region.nodes)
    conv, a1 = conv_pass(region, stem, f"Pass 1 of: {replaced}. {conv_cost(anchor, g, len(p.stored))}", p, registry)
    apply, a3 = apply_pass(region, stem, f"Pass 3 of: {replaced}.", p, registry)
    params = [n for n, _ in registry.values()]
    form = form_of(anchor)
    src = launcher(f"fused_{stem}", ["x", "weight", "norm_shape", "norm_eps", *params, *form.geometry],
                   launcher_lines(region, stem, p, a1, a3),
                   f"Fused: {replaced}. Statistics per normalized row of {numel(p.shape)} elements, merged in float64.")
    eps = p.norm.args[3]  # the module's, read when ModelNew runs; F.layer_norm's number as written
    eps_code = eps.expr() if isinstance(eps, Scalar) else repr(float(eps))
    call_args = [anchor.args[0], operand_code(anchor.args[1]), str(p.shape), f"float({eps_code})", *registry,
                 *geometry_code(anchor)]
    return RegionCode((conv, apply), src, (f"{', '.join(region.outputs)} = {call(f'fused_{stem}', call_args)}",))


def trailing(n: Node, shape: tuple[int, ...]) -> bool:
    """normalized_shape is the output's last k dims, 1 <= k < rank (never the batch), the affine of that shape."""
    norm = tuple(n.attrs.get("normalized_shape", ()))
    if not 1 <= len(norm) < len(shape) or tuple(shape[-len(norm):]) != norm:
        return False
    return all(a is None or (isinstance(a, Param) and tuple(a.shape) == norm) for a in n.args[1:3])


def layernorm_after_conv(walk: Walk, n: Node) -> bool:
    """A LayerNorm over trailing dims of a convolution's whole output, the walk's first norm."""
    anchor = walk.anchor
    if anchor.op not in (*CONV_OPS, TRANSPOSED) or (anchor.op in CONV_OPS and depthwise(anchor)):
        return False  # the direct depthwise tile has no tuned plan here; the other kinds refuse it too
    if (n.op != NORM or n.shape != anchor.shape or len(n.args) != 4 or not isinstance(n.args[0], str)
            or n.args[0] not in walk.values or any(m.op in NORMS for m in walk.members)):
        return False
    return trailing(n, anchor.shape)


class ConvLayerNorm(RegionKind):
    name = "conv_layernorm"
    family = "conv"
    kernel_modules = ("conv", "conv_transpose", "conv_norm")
    at_ops = (NORM,)

    def enters(self, walk: Walk, n: Node) -> bool:
        return layernorm_after_conv(walk, n) and not reads_outside(walk)

    def joins(self, walk: Walk, n: Node) -> bool:
        return joins_after_norm(walk, n, (NORM,), norm_input=True)  # the apply pass may read the norm's input (y)

    def finish(self, walk: Walk) -> list[Node]:
        return same_tile(walk)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return generate(region, g, stem)


KIND = ConvLayerNorm()
