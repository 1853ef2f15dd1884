"""Region kind `conv_epilogue`: one kernel, a convolution's implicit-GEMM tile (kernels/conv.py) and then a chain of
pointwise ops on its fp32 accumulator while it is still in registers, stored to the output's NC(D)HW layout.

Anchors: nn.Conv1d/2d/3d and F.conv1d/2d/3d (capture's `conv` op) with a parameter weight and a parameter bias or
none, at any stride, padding, dilation and groups; nn.ConvTranspose1d/2d/3d and F.conv_transpose1d/2d/3d (capture's
`conv_transpose` op) likewise, at any output_padding too, on kernels/conv_transpose.py's stride-phase tile (the
same tile per phase: no product with an inserted zero); depthwise ones (one input channel a group, not transposed) on
kernels/conv_depthwise.py's direct tile (a loop over the taps, no tl.dot; a depthwise transposed one stays a torch
call).
The tile is (output pixels, output channels of one group), so the ops after it join while every value they read is
the region's own, a number, or a per-channel parameter (a (C, 1, 1) bias, a (1, C, 1, 1) scale, ... anything that
broadcasts along the channel dim alone) or a one-element one, or a value of the output's shape that exists before the
convolution runs (a second forward input added to it, say: loaded at the tile's output offsets, a region input of
the autograd Function, whose gradient the backward's recompute gives).

Bytes (either form): x read once from memory (each value's reuse across the kernel window comes from L1/L2), the
weight's fp16 hi and lo once per row tile, each stored value written once; without fusion each pointwise op would
read and write the whole output again. Flops: 2 * N * OD*OH*OW * C_out * C_in/groups * KD*KH*KW (transposed: 2 * N *
D*H*W * C_in * C_out/groups * KD*KH*KW at most), three fp16 products of it on a GPU.
Backward: the region recomputed in torch in float64 (the conv by torch.nn.functional.conv{,_transpose}{1,2,3}d) and
differentiated (kfuse/backward.py's generic route): correct, not fast.
"""

from __future__ import annotations

from kfuse.ir import Graph, Node, Region
from kfuse.ops import VIEW_OPS
from kfuse.regions.common import KernelArgs, RegionCode, call, operand_code, pointwise_lines, var
from kfuse.regions.conv_common import (
    channel_operand,
    conv_cost,
    conv_kernel,
    conv_launcher,
    form_of,
    geometry_code,
    has_twin,
    is_conv_anchor,
    is_depthwise_anchor,
    outside_value,
)
from kfuse.regions.kind import RegionKind, Walk, pointwise_with, same_tile


class ConvEpilogue(RegionKind):
    name = "conv_epilogue"
    family = "conv"
    kernel_modules = ("conv", "conv_transpose", "conv_depthwise")
    upgradable = True  # a norm after the pointwise chain: a kind of the registry that `enters` there takes it over

    def starts(self, n: Node, g: Graph) -> bool:
        return is_conv_anchor(n) or is_depthwise_anchor(n)

    def joins(self, walk: Walk, n: Node) -> bool:
        """Pointwise ops of the table on the output's shape, reading region values, numbers, per-channel params, and
        values of the output's shape computed before the region (outside_value: loaded at the output offsets); views
        of a region value to the same shape (the kernel's identity; the backward's recompute runs the user's call, so
        a `.detach()` still stops gradients there)."""
        shape = walk.anchor.shape
        if n.shape != shape or not any(a in walk.values for a in n.value_args()):
            return False
        if n.op in VIEW_OPS:  # a view to the same shape (`.detach()`: capture keeps it a view): the same values
            return n.args[0] in walk.values
        return pointwise_with(n, lambda a: channel_operand(a, shape, walk.values) or outside_value(a, walk))

    def finish(self, walk: Walk) -> list[Node]:
        return same_tile(walk, lambda a: outside_value(a, walk))

    def generate(self, region: Region, g: Graph, stem: str) -> RegionCode:
        anchor = region.anchor
        env: dict[str, str] = {}
        inside = {n.name for n in region.nodes}  # what else the ops read was admitted as an outside_value
        args = KernelArgs(outside=frozenset(a for n in region.nodes[1:] for a in n.value_args() if a not in inside))
        bias = anchor.args[2]
        if bias is None:
            body = [f"{var(anchor.name)} = acc"]
        else:
            body = [f"{var(anchor.name)} = acc + {args.operand(bias, env)}  # bias of {anchor.origin}"]
        env[anchor.name] = var(anchor.name)
        body += pointwise_lines(list(region.nodes[1:]), env, args)
        outs = [f"out{i}" for i in range(len(region.outputs))]
        body += [f"tl.store({o}_ptr + out_offs, {env[v]}, mask=mask)" for o, v in zip(outs, region.outputs)]
        doc = "Fused: " + ", ".join(n.origin for n in region.nodes) + "."
        form = form_of(anchor)
        kernel = conv_kernel(form, stem, f"{doc} {conv_cost(anchor, g, len(outs))}", outs, args, body, sm90=True)
        launch = conv_launcher(form, stem, outs, args, doc, sm90=has_twin(kernel, stem))
        line = call(f"fused_{stem}", [anchor.args[0], operand_code(anchor.args[1]), *args.values,
                                      *geometry_code(anchor)])
        return RegionCode((kernel,), launch, (f"{', '.join(region.outputs)} = {line}",))


KIND = ConvEpilogue()
