"""What the convolution-anchored region kinds share: the tile's two forms (a convolution and a transposed one, on
kernels/conv.py's and kernels/conv_transpose.py's tiles), which nodes anchor a region, which operands a fused op on
the (pixels, channels) tile may read, the kernel frame around the tile, the launcher of a one-kernel region and the
cost line of a kernel's docstring. Each kind (regions/<kind>.py) adds its epilogue.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from kfuse.ir import Arg, Graph, Node, Param, Region, Scalar
from kfuse.kernels.conv_geometry import direct_k, stride1_padding
from kfuse.ops import CONV_OPS, TRANSPOSED_GEOMETRY, VIEW_OPS, conv_geometry_code
from kfuse.regions.common import (
    Decl,
    KernelArgs,
    call,
    constexpr,
    docstring,
    epilogue_fn,
    launcher,
    plain,
    signature,
    var,
)
from kfuse.regions.conv_twin import EPILOGUE_HEAD, conv_twin, epilogue_call, twin_ok
from kfuse.regions.kind import Walk, numel, pointwise_with

TRANSPOSED = "conv_transpose"  # capture's op for ConvTranspose1d/2d/3d and F.conv_transpose1d/2d/3d
CONV_CONSTEXPRS = tuple(constexpr(n) for n in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SCHEME", "DENSE"))


@dataclass(frozen=True)
class ConvForm:
    """What differs between a convolution's kernel and a transposed one's: the tile's operands and sizes (in the
    order the kernels module's plan returns them), the lines that compute the accumulator `acc` and the row mask
    `mask_m`, the line for the output offsets `out_offs` (from offs_n, the global channels), the plan and grid
    functions the launcher calls, and the launcher's geometry parameters."""

    params: tuple  # pointer parameters (the plan's `ops`)
    sizes: tuple  # size parameters (the plan's `sizes`)
    tile: tuple[str, ...]
    out_offs: str
    plan: str
    grid: str
    geometry: tuple[str, ...]  # the launcher's geometry parameters (the module's, in its call's order)
    prelude: tuple[str, ...] = ()  # launcher lines before the plan (they may rebind the weight and the geometry)
    plan_args: tuple[str, ...] = ()  # the geometry the plan takes, when not `geometry`

    def plan_line(self, sm90: bool = False) -> str:
        """The launcher's line calling the plan (after `prelude`); `sm90`: the kernel has a Hopper twin, which the
        plan may pick (kernels/conv.py conv_plan)."""
        args = ", ".join([*(self.plan_args or self.geometry), *(["sm90=True"] if sm90 else [])])
        return f"geo, scheme, cfg, ops, sizes = {self.plan}(x, weight, {args})"

    def head(self, sm90: bool = False) -> list[str]:
        """The launcher's first lines: x contiguous, the prelude, the plan."""
        return ["x = x.contiguous()", *self.prelude, self.plan_line(sm90)]


_TILE = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "SCHEME"]
# the launches' tile constexprs: DENSE is the plan's geometry's (kernels/conv.py dense_k; False for a transposed one)
TILE_LAUNCH = ["BLOCK_M=cfg.block_m", "BLOCK_N=cfg.block_n", "BLOCK_K=cfg.block_k", "SCHEME=scheme", "DENSE=geo.dense",
               "num_warps=cfg.num_warps", "num_stages=cfg.num_stages"]
# kernels/conv.py: conv_tile's operands and sizes (conv_operands, ConvGeometry.args), in its order
_CONV_SIZES = ("stride_wn", "M", "C_in", "D", "H", "W", "OD", "OH", "OW", "C_out", "CIN_G", "COUT_G", "KD", "KH", "KW",
               "SD", "SH", "SW", "PD", "PH", "PW", "DD", "DH", "DW")
CONV = ConvForm(
    plain("x_ptr", "w_ptr", "w_lo_ptr", "w_scale_ptr", "x_scale_ptr"), plain(*_CONV_SIZES),
    (call("acc = conv_tile", ["x_ptr", "w_ptr", "w_lo_ptr", "w_scale_ptr", "x_scale_ptr", "stride_wn", "pid_m",
                              "pid_n", "g"], list(_CONV_SIZES[1:]), [*_TILE, "DENSE"], width=112, indent=8),
     "offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
     "mask_m = offs_m < M"),
    "out_offs = conv_out_offsets(offs_m, offs_n, OD, OH, OW, C_out)",
    "conv_plan", "conv_grid", ("stride", "padding", "dilation", "groups"))
# kernels/conv_transpose.py: conv_transpose_tile's (conv_transpose_plan, TransposedGeometry.args)
_TRANSPOSED_SIZES = ("stride_wn", "N", "C_in", "D", "H", "W", "OD", "OH", "OW", "C_out", "CIN_G", "COUT_G", "SD", "SH",
                     "SW", "ED", "EH", "EW")
CONV_TRANSPOSE = ConvForm(
    plain("x_ptr", "w_ptr", "w_lo_ptr", "w_scale_ptr", "x_scale_ptr", "phase_ptr"), plain(*_TRANSPOSED_SIZES),
    (call("acc, rows, mask_m = conv_transpose_tile", ["x_ptr", "w_ptr", "w_lo_ptr", "w_scale_ptr", "x_scale_ptr",
                                                       "phase_ptr", "stride_wn", "pid_m", "pid_n", "g"],
          list(_TRANSPOSED_SIZES[1:]), _TILE, width=112, indent=8),),
    "out_offs = rows[:, None] + (offs_n.to(tl.int64) * (OD * OH * OW))[None, :]",
    "conv_transpose_plan", "conv_transpose_grid", ("stride", "padding", "output_padding", "groups", "dilation"))


# kernels/conv_depthwise.py: depthwise_tile takes conv_tile's operands and sizes and returns its accumulator, so
# only the tile's call and the plan differ (the grid is conv_grid: pixel blocks x channel-multiplier tiles, groups)
DEPTHWISE = ConvForm(CONV.params, CONV.sizes, (CONV.tile[0].replace("conv_tile", "depthwise_tile", 1), *CONV.tile[1:]),
                     CONV.out_offs, "depthwise_plan", "conv_grid", CONV.geometry)


# a ConvTranspose at stride 1 without output padding, on the convolution tile: the launcher turns the module's
# weight and geometry into the convolution's first (kernels/conv_transpose.py transposed_as_conv)
TRANSPOSED_AS_CONV = replace(CONV, geometry=CONV_TRANSPOSE.geometry, plan_args=CONV.geometry, prelude=(
    "# stride 1: the convolution it is, on the convolution tile",
    "weight, stride, padding, dilation, groups = transposed_as_conv(weight, stride, padding, output_padding, groups,",
    "                                                               dilation)"))
AS_CONV_SWITCH = "KFUSE_TRANSPOSED_AS_CONV"  # "0" when a file is generated: every ConvTranspose on the phase tile


def as_convolution(anchor: Node) -> bool:
    """Does a ConvTranspose run on the convolution tile as the convolution it is (stride 1, no output padding,
    padding at most dilation * (kernel - 1): the convolution's padding is the difference)? The phase tile runs the
    same products through its phase table at negative dilation; on an H200 the two ran KernelBench's 9 such files
    measured at 0.92-1.04x of each other (benchmarks/conv/NOTES.md), and the kinds' plain forms fuse more (a windowed
    pool in the tile, the ops after it). Not with KFUSE_TRANSPOSED_AS_CONV=0 (the A/B)."""
    if anchor.op != TRANSPOSED or os.environ.get(AS_CONV_SWITCH, "1") == "0":
        return False
    a = anchor.attrs
    return stride1_padding(tuple(anchor.args[1].shape[2:]), a["stride"], a["padding"], a["output_padding"],
                           a["dilation"]) is not None


def form_of(anchor: Node) -> ConvForm:
    if anchor.op == TRANSPOSED:
        return TRANSPOSED_AS_CONV if as_convolution(anchor) else CONV_TRANSPOSE
    return DEPTHWISE if depthwise(anchor) else CONV


def phase_tiled(anchor: Node) -> bool:
    """Does the convolution run on the transposed tile's stride phases (rows per phase, no per-pixel recompute)?"""
    return form_of(anchor) is CONV_TRANSPOSE


def depthwise(n: Node) -> bool:
    """One input channel a group (groups = in_channels): a group's GEMM is a K = kernel-volume sliver whose output
    channels (usually one) fill a sixteenth of the narrowest tensor-core tile (on an H100 the GEMM tile took
    KernelBench level 1 problem 82 to 46.3 ms against eager's 2.5 ms: benchmarks/conv/NOTES.md). A depthwise
    convolution runs on kernels/conv_depthwise.py's direct tile in the plain epilogue kind (is_depthwise_anchor);
    the kinds with a norm, reduction or pool after the convolution refuse it (their plans are the GEMM tile's), and
    a depthwise transposed one stays a torch call. Structural, not by channel counts: the CPU's small instances
    shrink channels, not groups' shape. A transposed convolution's weight is (C_in, C_out/groups, ...): one input
    channel a group is C_in == groups there."""
    return n.attrs.get("groups", 1) > 1 and group_channels(n)[0] == 1


def group_channels(n: Node) -> tuple[int, int]:
    """(CIN_G, COUT_G): a group's input and output channels (a transposed weight is (C_in, C_out / groups, ...))."""
    groups = n.attrs.get("groups", 1)
    w = n.args[1].shape
    return (w[0] // groups, w[1]) if n.op == TRANSPOSED else (w[1], w[0] // groups)


def conv_flops(anchor: Node, g: Graph) -> int:
    """2 x the convolution's multiply-adds: each output value's CIN_G x kernel volume (a transposed one: each input
    value's COUT_G x kernel volume, fewer at the borders)."""
    cin_g, cout_g = group_channels(anchor)
    taps = numel(tuple(anchor.args[1].shape[2:]))
    if anchor.op == TRANSPOSED:
        return 2 * numel(g.shape_of(anchor.args[0])) * cout_g * taps
    return 2 * numel(anchor.shape) * cin_g * taps


def has_tile_operands(n: Node) -> bool:
    """A convolution with a parameter weight, a parameter bias or none, a batched input (N, C, ...)."""
    if n.op not in (*CONV_OPS, TRANSPOSED) or len(n.args) != 3 or not isinstance(n.args[0], str):
        return False
    weight, bias = n.args[1], n.args[2]
    return (isinstance(weight, Param) and (bias is None or isinstance(bias, Param))
            and len(n.shape) == n.attrs.get("dims", 0) + 2 and numel(n.shape) > 0)


def is_conv_anchor(n: Node) -> bool:
    """A convolution the GEMM tile runs (either form): the tile's operands, not depthwise."""
    return has_tile_operands(n) and not depthwise(n)


def is_depthwise_anchor(n: Node) -> bool:
    """A depthwise convolution (not transposed) the direct tile runs (kernels/conv_depthwise.py)."""
    return n.op in CONV_OPS and has_tile_operands(n) and depthwise(n)


def channel_operand(a: Arg, shape: tuple[int, ...], values: set[str]) -> bool:
    """Can a fused op on the (pixels, channels) tile read this operand? Region values, numbers, and parameters that
    broadcast along the channel dim (1) of `shape` alone, or have one element."""
    if isinstance(a, str):
        return a in values
    if isinstance(a, Scalar):
        return True
    if isinstance(a, Param) and len(a.shape) <= len(shape):
        aligned = (1,) * (len(shape) - len(a.shape)) + tuple(a.shape)
        return aligned[1] in (1, shape[1]) and all(d == 1 for i, d in enumerate(aligned) if i != 1)
    return False


def outside_value(a: Arg, walk: Walk) -> bool:
    """A value the region does not compute, of the convolution's output shape, that exists before the convolution
    runs (a forward input, or a node earlier in graph order, so the region's call can read it): the plain
    convolution kind's kernel loads it at the tile's output offsets (KernelArgs.operand), e.g. a second input added
    after the conv."""
    if not isinstance(a, str) or a in walk.values or walk.g.shape_of(a) != walk.anchor.shape:
        return False
    if a in walk.g.inputs:
        return True
    names = [n.name for n in walk.g.nodes]
    return a in names and names.index(a) < names.index(walk.anchor.name)


def reads_outside(walk: Walk) -> bool:
    """Does an op after the anchor read an outside_value? Only the plain convolution kind's kernel loads one, so the
    kinds that take a walk over (norms, pools, channel reductions) leave such a walk to it."""
    return any(outside_value(a, walk) for m in walk.members[1:] for a in m.args)


def joins_after_norm(walk: Walk, n: Node, norm_ops: tuple[str, ...], norm_input: bool) -> bool:
    """Does n join a norm kind's walk after its norm? Pointwise ops on the output's shape that read the norm's
    value or what follows it (the apply pass holds nothing else; with `norm_input`, the norm's input too), numbers
    and per-channel parameters."""
    shape = walk.anchor.shape
    if n.shape != shape or not n.value_args():
        return False
    at = next(i for i, m in enumerate(walk.members) if m.op in norm_ops)
    readable = {m.name for m in walk.members[at:]} | ({walk.members[at].args[0]} if norm_input else set())
    return pointwise_with(n, lambda a: channel_operand(a, shape, readable))


# conv_cost's (how the products are computed, x's reads, what is said of x) where the direct tile runs, and where
# the packed tile does (x packed first, kernels/conv.py pack_input: read twice, its packed copy written and read once)
DIRECT_COST = ("fp32 products and sums on CUDA cores on a GPU: the direct tile", 1, "x read once, as it is")
PACKED_COST = ("three fp16 products of each on a GPU", 4,
               "x read twice and packed, the copy written and read once: more where channels pad to 16")


def runs_direct(anchor: Node) -> bool:
    """Does the convolution run on the direct tile at the problem's shape (kernels/conv_geometry.direct_k; not
    transposed)? The generated file decides at run time, from the shape it is called with."""
    return (anchor.op in CONV_OPS or as_convolution(anchor)) and direct_k(*group_channels(anchor))


def conv_cost(anchor: Node, g: Graph, outs: int) -> str:
    """What the region's kernel moves and computes at the problem's shape (fp32 x and outputs, fp16 hi + lo W)."""
    x_numel = numel(g.shape_of(anchor.args[0]))
    w_numel = numel(anchor.args[1].shape)
    out_numel = numel(anchor.shape)
    flops = conv_flops(anchor, g)
    plural = "s" if outs > 1 else ""
    if form_of(anchor) is DEPTHWISE:
        how, x_reads, x_text = "exact products summed in float64", 1, "x read once"
    elif runs_direct(anchor):
        how, x_reads, x_text = DIRECT_COST
    else:
        how, x_reads, x_text = PACKED_COST
    moved = 4 * (x_reads * x_numel + w_numel + outs * out_numel)
    return (f"At the problem's shape: {flops / 1e9:.3g} GFLOP ({how}), "
            f"{moved / 2 ** 20:.3g} MiB moved ({x_text}, W once, {outs} output{plural} written once).")


# Rows of the tile's GEMM a sample has (S_rows): the output's pixels, or the stride phase's (conv_transpose_tile's
# td * th * tw), by the form's plan. Rows are n * S_rows + s, so a row tile may end in one sample and start the next.
SAMPLE_ROWS = {
    "conv_plan": ("S_rows = OD * OH * OW  # rows a sample has",),
    "conv_transpose_plan": (
        "ph = phase_ptr + tl.program_id(2) * 10  # this phase's row of the phase table: rd, rh, rw first",
        "S_rows = ((OD - tl.load(ph) + SD - 1) // SD) * ((OH - tl.load(ph + 1) + SH - 1) // SH)",
        "S_rows = tl.maximum(S_rows * ((OW - tl.load(ph + 2) + SW - 1) // SW), 1)  # rows a sample has in this phase",
    ),
}


def tile_lines(form: ConvForm) -> list[str]:
    """Kernel lines: the tile's accumulator, its pixel and channel offsets and masks (the names KernelArgs' vector
    loads read: offs_n, mask_n), and the output offsets."""
    return [*tile_head(form), *offset_lines(form)]


def tile_head(form: ConvForm) -> list[str]:
    """The tile's ids, accumulator `acc`, rows (offs_m, mask_m) and channels within the group (offs_c)."""
    return ["pid_m, pid_n, g = conv_tile_ids(COUT_G, BLOCK_N)", *form.tile,
            "offs_c = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # channels within group g"]


def offset_lines(form: ConvForm) -> list[str]:
    """From the tile's rows and channels: the output channels, masks and offsets."""
    return ["offs_n = g * COUT_G + offs_c  # the output channels",
            "mask_n = offs_c < COUT_G",
            "mask = mask_m[:, None] & mask_n[None, :]",
            form.out_offs]


# A pass over values already in NC(D)HW memory (a norm's or a reduction's later pass), tiled as the convolution's
# own output tile: rows are output pixels (S of them a channel plane), columns channels, stores coalesced along
# the pixels.
PIXEL_TILE_LINES = ("offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
                    "offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
                    "mask_m = offs_m < M",
                    "mask_n = offs_n < C_out",
                    "mask = mask_m[:, None] & mask_n[None, :]",
                    "out_offs = conv_out_offsets(offs_m, offs_n, 1, 1, S, C_out)")
PIXEL_TILE_SIZES = ("M", "C_out", "S")
PIXEL_TILE_CONSTEXPRS = (("BLOCK_M", "BLOCK_M: tl.constexpr"), ("BLOCK_N", "BLOCK_N: tl.constexpr"))


def pixel_kernel(name: str, doc: str, pointers: list[str], args: KernelArgs, sizes: tuple[str, ...],
                 lines: list[str]) -> str:
    """`name`: a jit kernel over (pixels, channels) tiles of NC(D)HW values (PIXEL_TILE_LINES first), taking the
    `pointers`, the epilogue's operands, M, C_out, S and any extra `sizes`, then BLOCK_M and BLOCK_N."""
    decls = (*plain(*pointers), *args.decls(), *plain(*PIXEL_TILE_SIZES, *sizes), *PIXEL_TILE_CONSTEXPRS)
    return "\n".join(["@triton.jit", f"def {name}({signature(decls)}):", docstring(doc),
                      *[f"    {ln}" for ln in (*PIXEL_TILE_LINES, *lines)]]) + "\n"


def pixel_launch(kernel: str, args: list[str], sizes: list[str]) -> list[str]:
    """Launcher lines (after N, S and C): one launch of a pixel_kernel over the M = N * S pixels, `args` (its
    pointers and the epilogue's operands, in its order), then M, C, S and its extra `sizes`. 64 x 32 tiles on a GPU:
    at 128 x 32 the GroupNorm apply pass of problems/conv/38 took 255 registers and spilled (sm_90)."""
    return ["M = N * S",
            "bm, bn_ = (min(triton.next_power_of_2(max(M, 1)), 8192), 64) if interpreting() else (64, 32)",
            "if M:",
            "    " + call(f"{kernel}[(cdiv(M, bm), cdiv(C, bn_))]", args,
                          ["M", "C", "S", *sizes, "BLOCK_M=bm", "BLOCK_N=bn_", "num_warps=4"], indent=12)]


def conv_kernel(form: ConvForm, name: str, doc: str, outs: list[str], args: KernelArgs, body: list[str],
                extra: tuple[str, ...] = (), sm90: bool = False) -> str:
    """`<name>_kernel`: the tile, the epilogue's loads, then `body`; its parameters the tile's operands, the `outs`
    pointers, the `extra` sizes, the epilogue's operands, the tile's sizes and constexprs. `sm90`: where twin_ok
    holds, the epilogue is a jit function `<name>_epilogue` which the kernel and its Hopper twin
    `<name>_kernel_sm90` (regions/conv_twin.py) call (has_twin tells the launcher)."""
    decls: tuple[Decl, ...] = (*form.params, *plain(*[f"{o}_ptr" for o in outs]), *plain(*extra), *args.decls(),
                               *form.sizes, *CONV_CONSTEXPRS)
    head = ["@triton.jit", f"def {name}_kernel({signature(decls)}):", docstring(doc)]
    epilogue = [*offset_lines(form), *args.loads, *body]
    if not (sm90 and twin_ok(form.tile == CONV.tile, epilogue)):
        return "\n".join([*head, *[f"    {ln}" for ln in (*tile_lines(form), *epilogue)]]) + "\n"
    kernel = [*head, *[f"    {ln}" for ln in tile_head(form)],
              "    " + epilogue_call(name, decls, ("offs_m", "mask_m", "offs_c"), indent=8)]
    return "\n\n\n".join([epilogue_fn(name, EPILOGUE_HEAD, decls, epilogue), "\n".join(kernel) + "\n",
                         conv_twin(name, decls, doc)])


def has_twin(kernel_src: str, name: str) -> bool:
    """Whether conv_kernel made `<name>_kernel` with a Hopper twin."""
    return f"def {name}_kernel_sm90(" in kernel_src


def conv_launcher(form: ConvForm, name: str, outs: list[str], args: KernelArgs, doc: str, sm90: bool = False) -> str:
    """fused_<name>(x, weight, <epilogue operands>, <geometry>): geometry, scheme, tile config and operands from the
    kernels module (conv_plan or conv_transpose_plan), one launch, the outputs in x's layout and dtype. `sm90`: the
    kernel has a Hopper twin (has_twin), which the plan may pick and pick_conv then launches."""
    launch = launch_call(form, name, outs, args, sm90)
    if form.plan in ("conv_plan", "conv_transpose_plan"):  # the tile tuned on a GPU's first call at each geometry
        run = ["def launch(cfg):", *[f"    {ln}" for ln in launch.splitlines()],
               f"launch(tuned_conv({name}_kernel, geo, scheme, cfg, x, launch))"]
    else:
        run = launch.splitlines()
    body = [*form.head(sm90),
            *[f"{o} = torch.empty(geo.out_shape, device=x.device, dtype=x.dtype)" for o in outs],
            "if geo.M:", *[f"    {ln}" for ln in run],
            f"return {', '.join(outs)}"]
    return launcher(f"fused_{name}", ["x", "weight", *args.params, *form.geometry], body, doc)


def geometry_code(anchor: Node) -> list[str]:
    if anchor.op == TRANSPOSED:
        return conv_geometry_code(anchor.attrs, anchor.module, TRANSPOSED_GEOMETRY)
    return conv_geometry_code(anchor.attrs, anchor.module)


def conv_bias(anchor: Node, env: dict[str, str], args: KernelArgs) -> list[str]:
    """The convolution's own epilogue: its bias, if any."""
    bias = anchor.args[2]
    env[anchor.name] = var(anchor.name)
    if bias is None:
        return [f"{var(anchor.name)} = acc"]
    return [f"{var(anchor.name)} = acc + {args.operand(bias, env)}  # bias of {anchor.origin}"]


def stores(values: list[str], env: dict[str, str]) -> list[str]:
    """Kernel lines storing each value at the output offsets into buf_<value>."""
    return [f"tl.store(buf_{v}_ptr + out_offs, {env[v]}, mask=mask)" for v in values]


def conv_launch(form: ConvForm, kernel: str, ptrs: list[str], args: KernelArgs, sm90: bool = False) -> list[str]:
    """Launcher lines: one launch of a conv-tile kernel of this region under `geo`, `cfg`, `scheme`; `sm90`: the
    kernel has a Hopper twin (has_twin), launched for an sm90 config (pick_conv)."""
    return ["if geo.M:", *[f"    {ln}" for ln in launch_call(form, kernel, ptrs, args, sm90).splitlines()]]


def launch_call(form: ConvForm, kernel: str, ptrs: list[str], args: KernelArgs, sm90: bool) -> str:
    """The call launching `<kernel>_kernel` (its twin for an sm90 config, where it has one: pick_conv) on the plan's
    operands, the `ptrs`, the epilogue's operands and the plan's sizes, at `cfg`."""
    name = f"pick_conv({kernel}_kernel, {kernel}_kernel_sm90, cfg)" if sm90 else f"{kernel}_kernel"
    return call(f"{name}[{form.grid}(geo, cfg)]", ["*ops", *ptrs, *args.params, "*sizes"],
                [*TILE_LAUNCH, *(["**conv_options(cfg)"] if sm90 else [])])


def tuned_lines(kernel: str, launch: str, body: list[str], buffers: list[str],
                same_columns: bool = False) -> list[str]:
    """Launcher lines: `<launch>(cfg)` runs `body` (allocating the `buffers` whose size follows the tile, e.g.
    per-tile partial statistics, then launching `kernel` at cfg) and returns the buffers; the tuner times it at each
    candidate tile (tuned_conv, on a GPU's first call at each geometry; `same_columns`: tuned_conv's), then it runs at
    the pick and `cfg` is rebound to that tile. Each timed call allocates its own buffers, so no call reads
    another's."""
    names = ", ".join(buffers)
    tune = call("cfg = tuned_conv", [kernel, "geo", "scheme", "cfg", "x", launch,
                                     *(["same_columns=True"] if same_columns else [])], [])
    return [f"def {launch}(cfg):", *[f"    {ln}" for ln in body], *([f"    return {names}"] if buffers else []),
            "if geo.M:", *[f"    {ln}" for ln in tune.splitlines()],
            f"{names} = {launch}(cfg)" if buffers else f"{launch}(cfg)"]


def tuned_launch(form: ConvForm, kernel: str, ptrs: list[str], args: KernelArgs, buffers: list[str],
                 allocate: list[str], same_columns: bool = False, sm90: bool = False) -> list[str]:
    """tuned_lines of conv_launch (of `<kernel>_kernel`, in `<kernel>_launch(cfg)`) after the `allocate` lines."""
    return tuned_lines(f"{kernel}_kernel", f"{kernel}_launch",
                       [*allocate, *conv_launch(form, kernel, ptrs, args, sm90)], buffers, same_columns)


def row_shape_code(n: Node, anchor: Node) -> str:
    """A per-pixel value's shape at run time, from the convolution's output shape."""
    keep = len(n.shape) == len(anchor.shape)
    return "(geo.out_shape[0], 1, *geo.out_shape[2:])" if keep else "(geo.out_shape[0], *geo.out_shape[2:])"


# ---- pools after a convolution (the kind of regions/ that fuses them, and the CUDA backend's) ----------------------
WINDOWED = ("pool", "max_pool1d", "avg_pool1d")
MEANS = ("mean_dims", "mean")


class NormParts:
    """A norm kind's region cut at its norm (the first node whose op is one of `ops`) and at a windowed pool or a
    global mean after it, if any: the ops before the norm, between it and the pool (or the end: `after`), after the
    pool (`post`);
    what pass 1 stores (`stored`: y, the norm's input, and the region outputs before the norm) and which region
    outputs the apply pass stores (`post_outs`)."""

    def __init__(self, region: Region, ops: tuple[str, ...]) -> None:
        nodes = list(region.nodes)
        self.at, self.norm = next((i, n) for i, n in enumerate(nodes) if n.op in ops)
        p_at = next((i for i, n in enumerate(nodes) if i > self.at and n.op in (*WINDOWED, *MEANS)), None)
        pooling = None if p_at is None else nodes[p_at]
        self.pool = pooling if pooling is not None and pooling.op in WINDOWED else None
        self.mean = pooling if pooling is not None and pooling.op in MEANS else None  # of the norm's output itself
        self.before = nodes[1:self.at]
        self.after = nodes[self.at + 1:len(nodes) if p_at is None else p_at]
        self.post = [] if p_at is None else nodes[p_at + 1:]
        pre = {n.name for n in nodes[:self.at]}
        self.pre_outs = [v for v in region.outputs if v in pre]
        self.post_outs = [v for v in region.outputs if v not in pre]
        self.y = self.norm.args[0]
        # y is read by the apply pass; a mean of the norm's output needs none (its finalize reads the statistics)
        self.stored = list(dict.fromkeys([*([self.y] if self.mean is None else []), *self.pre_outs]))


def spatial_dims(n: Node, g: Graph) -> tuple[int, ...]:
    """The dims a mean node reduces, normalized to non-negative."""
    rank = len(g.shape_of(n.args[0]))
    dims = n.attrs.get("dims", (n.attrs.get("dim"),))
    return tuple(sorted(d % rank for d in dims if isinstance(d, int)))


def is_global_mean(n: Node, g: Graph) -> bool:
    """A mean over every spatial dim (and no other) of a rank >= 3 value."""
    if n.op not in MEANS or not n.args or not isinstance(n.args[0], str):
        return False
    rank = len(g.shape_of(n.args[0]))
    return rank >= 3 and spatial_dims(n, g) == tuple(range(2, rank))


def per_sample_channel(shape: tuple[int, ...], pooled: tuple[int, ...]) -> bool:
    """(N, C) then unit dims only, N and C the global mean's."""
    return len(shape) >= 2 and shape[:2] == pooled[:2] and all(d == 1 for d in shape[2:])


def joins_after_pool(members: list[Node], at: int, n: Node) -> bool:
    """Does n join after the walk's pool or global mean (members[at])? Pointwise ops on its shape reading its values
    and what follows it, numbers and per-channel parameters; after a global mean, whose values are one per (sample,
    channel), ops and views that keep that (dropping or adding unit dims)."""
    head = members[at]
    readable = {m.name for m in members[at:]}
    if head.op in WINDOWED:
        shape_ok = n.shape == head.shape
    else:
        shape_ok = per_sample_channel(n.shape, head.shape)
        if n.op in VIEW_OPS:
            return shape_ok and n.args[0] in readable
    return shape_ok and bool(n.value_args()) and pointwise_with(n, lambda a: channel_operand(a, n.shape, readable))


def mean_outputs(outs: list[str], region: Region, values: list[str] | None = None) -> list[str]:
    """Launcher lines allocating a global mean's outputs (`values`, default the region's outputs), one value per
    (sample, channel), at each output's rank."""
    ranks = {n.name: len(n.shape) for n in region.nodes}
    return [f"{o} = torch.empty((N, C{', 1' * (ranks[v] - 2)}), device=x.device, dtype=x.dtype)"
            for o, v in zip(outs, region.outputs if values is None else values)]


def pool_at(members: list[Node]) -> int:
    return next(i for i, m in enumerate(members) if m.op in (*WINDOWED, *MEANS))


def mean_at(members: list[Node]) -> int | None:
    """Where the region's global mean is (its pool, or a mean of a windowed pool's values), if it has one."""
    return next((i for i, m in enumerate(members) if m.op in MEANS), None)


def pool_code(n: Node) -> list[str]:
    """kernel_size, stride, padding, dilation, ceil_mode, count_include_pad, divisor_override as generated code:
    read from the module when ModelNew runs (as the conv's geometry), else the call's literals."""
    fields = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "count_include_pad", "divisor_override")
    if n.op != "pool":  # max_pool1d / avg_pool1d: non-overlapping windows of k
        k = n.args[1]
        base = {"kernel_size": k.expr(), "stride": "None", "padding": "0", "dilation": "1", "ceil_mode": "False",
                "count_include_pad": "True", "divisor_override": "None"}
        if n.module:
            base.update({f: f"self.{n.module}.{f}" for f in ("kernel_size", "stride", "padding", "ceil_mode")})
        return [base[f] for f in fields]
    mode = n.attrs["mode"]
    owned = ("dilation",) if mode == "max" else ("count_include_pad", "divisor_override")
    if n.attrs["dims"] == 1:  # nn.AvgPool1d has no divisor_override (AvgPool2d / 3d have): the call's value (None)
        owned = tuple(f for f in owned if f != "divisor_override")
    return [f"self.{n.module}.{f}" if n.module and (f in owned or f in fields[:3] or f == "ceil_mode")
            else repr(n.attrs[f]) for f in fields]


def is_max(n: Node) -> bool:
    return n.op == "max_pool1d" or (n.op == "pool" and n.attrs["mode"] == "max")
