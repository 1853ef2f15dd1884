"""Region kind `conv_channel_reduce`: convolution -> pointwise ops -> ONE reduction over the channels (dim 1: sum,
mean, max/amax, min/amin, logsumexp, keepdim or not) or softmax / log_softmax over dim 1 -> pointwise ops, on
kernels/conv.py's tile (or kernels/conv_transpose.py's stride phases).

The launcher picks by T, the column tiles a pixel's channels span (groups * cdiv(C_out / groups, BLOCK_N)):
  T = 1 (one group whose channels fit a column tile; on a GPU every KernelBench level 2 channel reduction):
     `<name>_one_tile_kernel`: the whole region in the convolution's epilogue, the reduction over the tile's
     columns (float64 sums, the per-pixel ops in float64), softmax = exp(y - logsumexp) and the ops after it there
     too. One launch; only the region's outputs are written.
  T > 1: no tile sees a pixel's channels, so two phases (kernels/conv_reduce.py), up to three launches:
  1. `<name>_kernel`: the convolution and the full-width ops before the reduction ("pre"); per (pixel, column
     tile) the tile's partials into a (P, T) buffer (regions/rowstats.py's PARTIAL_LINES: sum in float64, max,
     min, or logsumexp's (max, sum of exp)); the pre values the apply pass reads (softmax's input), in fp32;
  2. `<name>_finalize_kernel` (rowstats.finalize_kernel, shared with the GEMM's row reductions): per pixel, merges
     the T partials, runs the per-pixel ops after a reduction ("row", in float64) and stores the (P,) results;
  3. `<name>_apply_kernel`, where a full-width value reads a per-pixel one ("post": softmax = exp(y - lse),
     log_softmax = y - lse, x - x.amax(1, keepdim=True), the ops after a softmax): one pass over (pixels,
     channels) tiles of the NC(D)HW layout, stores coalesced along the pixels as the convolution's.
Bytes beyond the convolution: one tile, the outputs alone (a reduction's P values instead of the N x C_out x S
output torch writes and reads back). Two phases: P * T partials, P results; softmax writes y and reads it once more
(8 B per element at fp32) where torch writes the conv's output, reads it twice for the softmax and reads and writes
every value once per op after it.
Backward: the region recomputed in float64 torch (the reductions and softmax by their torch calls) and
differentiated, as the convolution kinds do (kfuse/backward.py): correct, not fast.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Region
from kfuse.ops import CONV_OPS, REDUCE_OPS, VIEW_OPS
from kfuse.regions.common import (
    KernelArgs,
    RegionCode,
    call,
    launcher,
    operand_code,
    pointwise_lines,
    var,
)
from kfuse.regions.conv_common import (
    TRANSPOSED,
    ConvForm,
    channel_operand,
    conv_bias,
    conv_cost,
    conv_kernel,
    depthwise,
    form_of,
    geometry_code,
    has_twin,
    phase_tiled,
    pixel_kernel,
    reads_outside,
    row_shape_code,
    tuned_launch,
)
from kfuse.regions.kind import RegionKind, Walk, per_row_operand, pointwise_with
from kfuse.regions.rowstats import (
    PARTIAL_DTYPE,
    PARTIAL_LINES,
    STAT,
    TWO_PARTIALS,
    as_pointwise,
    finalize_kernel,
    row_roles,
)

SOFTMAX_OPS = ("softmax", "log_softmax")
# the tile row's pixel: a convolution's rows are its pixels; a transposed one's, output offsets at channel 0
PIXEL = {False: "pix = offs_m.to(tl.int64)  # the output pixel n * S + s of each row",
         True: "pix = conv_pixels(rows, C_out, OD * OH * OW)  # the output pixel n * S + s of each phase row"}


def row_shapes(anchor: Node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A per-pixel value's two shapes: keepdim (N, 1, spatial...) and not (N, spatial...)."""
    n, _, *spatial = anchor.shape
    return (n, 1, *spatial), (n, *spatial)


def over_channels(n: Node, g: Graph, anchor: Node) -> bool:
    """A reduction or softmax over dim 1 of a value of the convolution's output shape."""
    if n.op not in REDUCE_OPS and n.op not in SOFTMAX_OPS or not n.args or not isinstance(n.args[0], str):
        return False
    dim = n.attrs.get("dim")
    return (g.shape_of(n.args[0]) == anchor.shape and isinstance(dim, int) and not isinstance(dim, bool)
            and dim in (1, 1 - len(anchor.shape)))


def reduction_of(nodes: list[Node]) -> Node | None:
    return next((m for m in nodes[1:] if m.op in REDUCE_OPS or m.op in SOFTMAX_OPS), None)


def joins_channels(walk: Walk, n: Node) -> bool:
    """After the reduction: per-pixel ops on per-pixel values (numbers and one-element parameters), full-width ops
    on the tile (per-channel parameters, per-pixel values in their keepdim shape), never a second reduction."""
    anchor, g = walk.anchor, walk.g
    roles = row_roles(walk.members, g)
    vals = n.value_args()
    if not vals or not all(v in roles for v in vals) or n.op in REDUCE_OPS or n.op in SOFTMAX_OPS:
        return False
    keep, drop = row_shapes(anchor)
    if {roles[v] for v in vals} <= {"reduce", "row"}:
        return n.shape in (keep, drop) and (n.op in VIEW_OPS or pointwise_with(n, per_row_operand))
    if n.shape != anchor.shape:
        return False

    def readable(a: object) -> bool:
        if isinstance(a, str) and roles[a] in ("reduce", "row"):
            return g.shape_of(a) == keep  # broadcast along the channels
        return channel_operand(a, anchor.shape, set(roles))

    return pointwise_with(n, readable)


class Parts:
    """The region cut by phase (rowstats.row_roles): the reduction `red` over `y`, the ops of each phase,
    and what each phase stores or reads."""

    def __init__(self, region: Region, g: Graph) -> None:
        nodes = list(region.nodes)
        self.roles = roles = row_roles(nodes, g)
        self.red = red = reduction_of(nodes)
        self.y = red.args[0]
        self.pre = [n for n in nodes[1:] if roles[n.name] == "pre"]
        self.row = [n for n in nodes if roles[n.name] == "row"]
        self.post = [n for n in nodes if roles[n.name] == "post"]
        outputs = list(region.outputs)
        self.apply_pre = list(dict.fromkeys(([self.y] if red.op in SOFTMAX_OPS else [])
                                            + [a for n in self.post for a in n.value_args() if roles.get(a) == "pre"]))
        self.apply_row = list(dict.fromkeys(a for n in self.post for a in n.value_args()
                                            if roles.get(a) in ("reduce", "row")))
        self.full = list(dict.fromkeys([v for v in outputs if roles[v] == "pre"] + self.apply_pre))  # phase 1 stores
        self.post_outs = [v for v in outputs if roles[v] == "post"]


def partials_kernel(region: Region, form: ConvForm, name: str, doc: str, p: Parts,
                    registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """Phase 1: the convolution, the ops before the reduction, the full-width values later phases read, and the
    tile's partials per pixel at column (group, column tile) of the (P, T) buffers."""
    args, env = KernelArgs(registry), {}
    body = conv_bias(region.anchor, env, args) + pointwise_lines(as_pointwise(p.pre), env, args)
    body += [f"tl.store(buf_{v}_ptr + out_offs, {env[v]}, mask=mask)" for v in p.full]
    body += [f"# partials of {p.red.origin} over this column tile, per output pixel",
             PIXEL[phase_tiled(region.anchor)]]
    body += [ln.format(y=env[p.y]) for ln in PARTIAL_LINES[STAT[p.red.op]]]
    body += ["T = tl.num_programs(1) * tl.cdiv(COUT_G, BLOCK_N)  # column tiles of all groups",
             "tl.store(pa_ptr + pix * T + g * tl.cdiv(COUT_G, BLOCK_N) + pid_n, part_a, mask=mask_m)"]
    if STAT[p.red.op] in TWO_PARTIALS:
        body.append("tl.store(pb_ptr + pix * T + g * tl.cdiv(COUT_G, BLOCK_N) + pid_n, part_b, mask=mask_m)")
    outs = [f"buf_{v}" for v in p.full] + ["pa", "pb"]
    return conv_kernel(form, name, doc, outs, args, body), args


def apply_kernel(name: str, doc: str, p: Parts, row_ptrs: list[str], registry: dict[str, tuple[str, bool]]
                 ) -> tuple[str, KernelArgs]:
    """Phase 3: (pixels, channels) tiles of the NC(D)HW output (S pixels a channel plane): the full-width values
    of phase 1 and the per-pixel results in, the post ops, their stores."""
    args = KernelArgs(registry)
    env = {v: var(v) for v in p.apply_pre + p.apply_row}
    body: list[str] = []
    for n in p.post:
        if n is p.red:
            formula = "tl.exp({y} - st_a)  # exp(y - logsumexp)" if n.op == "softmax" else "{y} - st_a"
            body.append(f"{var(n.name)} = {formula.format(y=env[p.y])}  # {n.origin}")
            env[n.name] = var(n.name)
        else:
            body += pointwise_lines(as_pointwise([n]), env, args)
    body += [f"tl.store(o_{v}_ptr + out_offs, {env[v]}, mask=mask)" for v in p.post_outs]
    ins = [f"buf_{v}" for v in p.apply_pre]
    lines = [*[f"{var(v)} = tl.load(buf_{v}_ptr + out_offs, mask=mask, other=0.0).to(tl.float32)" for v in p.apply_pre],
             *[f"{var(v)} = tl.load(k_{v}_ptr + offs_m, mask=mask_m, other=0.0)[:, None]" for v in p.apply_row],
             *(["st_a = tl.load(st_a_ptr + offs_m, mask=mask_m, other=0.0)[:, None]"] if "st_a" in row_ptrs else []),
             *args.loads, *body]
    pointers = [f"{b}_ptr" for b in ins + row_ptrs + [f"o_{v}" for v in p.post_outs]]
    return pixel_kernel(f"{name}_apply_kernel", doc, pointers, args, (), lines), args


def dtype(returned: bool) -> str:
    """A buffer's dtype: the model's where the model returns it, fp32 where only a later phase reads it."""
    return "x.dtype" if returned else "torch.float32"


# the reduction's value from the one tile's PARTIAL_LINES, where the tile holds every channel of its pixels
ONE_TILE_RESULT = {"sum": "part_a", "mean": "part_a / C_out", "amax": "part_a", "amin": "part_a",
                   "logsumexp": "part_a + tl.log(part_b)", "softmax": "part_a + tl.log(part_b)",
                   "log_softmax": "part_a + tl.log(part_b)"}


def one_tile_kernel(region: Region, form: ConvForm, name: str, doc: str, p: Parts,
                    registry: dict[str, tuple[str, bool]]) -> tuple[str, KernelArgs]:
    """One group whose channels fit one column tile (T = 1): the whole region in the convolution's epilogue, the
    reduction over the tile's columns, no partials, no second pass over the output. The same arithmetic as the
    two phases at T = 1 (float64 sums, the per-pixel ops in float64)."""
    args, env = KernelArgs(registry), {}
    body = conv_bias(region.anchor, env, args) + pointwise_lines(as_pointwise(p.pre), env, args)
    body += [f"# {p.red.origin}: this tile holds every channel of its pixels",
             *[ln.format(y=env[p.y]) for ln in PARTIAL_LINES[STAT[p.red.op]]]]
    if p.red.op in SOFTMAX_OPS:
        body.append(f"lse = ({ONE_TILE_RESULT[p.red.op]})[:, None]")
        formula = "tl.exp({y} - lse)" if p.red.op == "softmax" else "{y} - lse"
        body.append(f"{var(p.red.name)} = {formula.format(y=env[p.y])}  # {p.red.origin}")
    else:
        body.append(f"{var(p.red.name)} = ({ONE_TILE_RESULT[p.red.op]}).to(tl.float64)  # {p.red.origin}")
        body += pointwise_lines(as_pointwise(p.row), {**env, p.red.name: var(p.red.name)}, args)
    env.update({n.name: var(n.name) for n in [p.red, *p.row]})
    body += [f"{var(v)}_2d = {var(v)}.to(tl.float32)[:, None]  # broadcast along the channels" for v in p.apply_row]
    body += pointwise_lines(as_pointwise([n for n in p.post if n is not p.red]),
                            {**env, **{v: f"{var(v)}_2d" for v in p.apply_row}}, args)
    env.update({n.name: var(n.name) for n in p.post})
    outs = [v for v in region.outputs if p.roles[v] in ("pre", "post")]
    rows = [v for v in region.outputs if p.roles[v] not in ("pre", "post")]
    if rows:
        body.append(PIXEL[phase_tiled(region.anchor)])
    body += [f"tl.store({buffer(v, p)}_ptr + out_offs, {env[v]}, mask=mask)" for v in outs]
    body += [f"tl.store(o_{v}_ptr + pix, {env[v]}, mask=mask_m)" for v in rows]
    return conv_kernel(form, f"{name}_one_tile", doc, [buffer(v, p) for v in outs + rows], args, body,
                       sm90=True), args


def buffer(v: str, p: Parts) -> str:
    """The launcher's tensor for region output v: buf_<v> for values before the reduction, o_<v> after it."""
    return f"buf_{v}" if p.roles[v] == "pre" else f"o_{v}"


def alloc(v: str, p: Parts) -> str:
    shape = "geo.out_shape" if p.roles[v] in ("pre", "post") else "(P,)"
    return f"{buffer(v, p)} = torch.empty({shape}, device=x.device, dtype=x.dtype)"


def generate(region: Region, g: Graph, stem: str) -> RegionCode:
    anchor, form, p = region.anchor, form_of(region.anchor), Parts(region, g)
    stat = STAT[p.red.op]
    registry: dict[str, tuple[str, bool]] = {}
    replaced = ", ".join(n.origin for n in region.nodes)
    outputs = list(region.outputs)
    cost = conv_cost(anchor, g, len(outputs))
    one, a0 = one_tile_kernel(region, form, stem, f"Fused, one column tile a pixel: {replaced}. {cost}", p, registry)
    kernel1, a1 = partials_kernel(region, form, stem, f"Phase 1 of: {replaced}. {cost}", p, registry)
    finalize, row_stores, a2 = finalize_kernel(stem, p.red, p.row, outputs, p.apply_row, registry)
    kernels = [one, kernel1, finalize]
    by_name = {n.name: n for n in region.nodes}
    rets = ", ".join(buffer(v, p) if p.roles[v] in ("pre", "post") else
                     f"o_{v}.reshape({row_shape_code(by_name[v], anchor)})" for v in outputs)
    sm90 = has_twin(one, f"{stem}_one_tile")  # the partials kernel has none (it reads the groups' grid dim)
    lines = [*form.head(sm90),
             "P = geo.out_shape[0] * torch.Size(geo.out_shape[2:]).numel()  # output pixels",
             "C = geo.out_shape[1]",
             "T = geo.groups * cdiv(geo.COUT_G, cfg.block_n)  # column tiles over all groups",
             "if T == 1:  # each pixel's channels in one tile: one kernel, tuned among tiles as wide",
             *[f"    {alloc(v, p)}" for v in outputs],
             *[f"    {ln}" for ln in tuned_launch(form, f"{stem}_one_tile", [buffer(v, p) for v in outputs
                                                                                if p.roles[v] in ("pre", "post")]
                                                  + [f"o_{v}" for v in outputs if p.roles[v] not in ("pre", "post")],
                                                  a0, [], [], same_columns=True, sm90=sm90)],
             f"    return {rets}"]
    if sm90:
        lines += ["if cfg.sm90:  # the two phases on the Triton tile: its operands", "    " + form.plan_line()]
    lines += [f"buf_{v} = torch.empty(geo.out_shape, device=x.device, dtype={dtype(v in outputs)})" for v in p.full]
    lines += tuned_launch(form, stem, [f"buf_{v}" for v in p.full] + ["pa", "pb"], a1, ["pa", "pb", "T"],
                          ["T = geo.groups * cdiv(geo.COUT_G, cfg.block_n)  # partials by column tile",
                           f"pa = torch.empty((P, T), device=x.device, dtype={PARTIAL_DTYPE[stat]})",
                           "pb = torch.empty_like(pa)" if stat in TWO_PARTIALS else "pb = pa"])
    lines += [f"{r} = torch.empty((P,), device=x.device, dtype={dtype(r.startswith('o_'))})" for r in row_stores]
    lines += ["fm = min(triton.next_power_of_2(P), 4096) if interpreting() else 64",
              "if P:",
              "    " + call(f"{stem}_finalize_kernel[(cdiv(P, fm),)]", ["pa", "pb", *row_stores, *a2.params],
                              ["P", "C", "T", "cfg.block_n", "BLOCK_M=fm"], indent=12)]
    if p.post:
        apply, a3 = apply_kernel(stem, f"Phase 3 of: {replaced}: the full-width ops reading a per-pixel result.", p,
                                 [r for r in row_stores if not r.startswith("o_")], registry)
        kernels.append(apply)
        lines += [f"o_{v} = torch.empty(geo.out_shape, device=x.device, dtype=x.dtype)" for v in p.post_outs]
        lines += ["bm, bn_ = (min(triton.next_power_of_2(max(P, 1)), 8192), 64) if interpreting() else (128, 32)",
                  "if P:",
                  "    " + call(f"{stem}_apply_kernel[(cdiv(P, bm), cdiv(C, bn_))]",
                              [f"buf_{v}" for v in p.apply_pre], [r for r in row_stores if not r.startswith("o_")],
                              [f"o_{v}" for v in p.post_outs], a3.params,
                              ["P", "C", "P // geo.out_shape[0]", "BLOCK_M=bm", "BLOCK_N=bn_", "num_warps=4"],
                              indent=12)]
    lines.append(f"return {rets}")
    params = [n for n, _ in registry.values()]
    src = launcher(f"fused_{stem}", ["x", "weight", *params, *form.geometry], lines,
                   f"Fused: {replaced}. {p.red.op} over the channels: in the convolution's epilogue where one column "
                   "tile holds them, else in two phases (per column-tile partials, a per-pixel merge).")
    call_args = [anchor.args[0], operand_code(anchor.args[1]), *registry, *geometry_code(anchor)]
    return RegionCode(tuple(kernels), src, (f"{', '.join(outputs)} = {call(f'fused_{stem}', call_args)}",))


class ConvChannelReduce(RegionKind):
    name = "conv_channel_reduce"
    family = "conv"
    at_ops = (*REDUCE_OPS, *SOFTMAX_OPS)
    kernel_modules = ("conv", "conv_transpose", "conv_reduce")

    def enters(self, walk: Walk, n: Node) -> bool:
        anchor = walk.anchor
        if anchor.op in CONV_OPS and depthwise(anchor):  # the direct tile (kernels/conv_depthwise.py): no reduction
            return False
        return (anchor.op in (*CONV_OPS, TRANSPOSED) and len(anchor.shape) >= 3 and reduction_of(walk.members) is None
                and over_channels(n, walk.g, anchor) and n.args[0] in walk.values and not reads_outside(walk))

    def joins(self, walk: Walk, n: Node) -> bool:
        return joins_channels(walk, n)

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        return generate(region, g, stem)


KIND = ConvChannelReduce()
