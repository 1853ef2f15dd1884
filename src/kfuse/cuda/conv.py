"""The CUDA code of the convolution kind: nn.Conv1d/2d/3d, nn.ConvTranspose1d/2d/3d or their functional forms (any
stride, padding, 'same', output_padding, dilation and groups, depthwise too; bias or none) and the pointwise chain
after it, the twin of the registry's plain convolution kind (the one a norm or reduction after the chain takes over
on the Triton backend). Groups of fewer than 8 input channels run on the direct tile (runs_direct,
conv_direct_source.py), the others on the implicit-GEMM tile (conv_source.py).

A region becomes: its functor `Conv_<stem>` (the bias, the chain, the stores at `base + n P` into NC(D)HW outputs),
the CUDA launcher running conv_source.py's implicit-GEMM tile with it, the bound C++ function (x's records packed
by kf_conv_pack on the same stream, then the tile once per launch), the Python launcher `fused_<stem>` (the geometry
from kfuse/kernels/conv_geometry.py or conv_phases.py, the weight's split rows cached on the weight and the launches:
kfuse/cuda/conv_runtime.py; a transposed convolution runs a launch per stride phase) and its autograd Function, a
CudaRecomputeFn: backward recomputes the region in float64 torch and differentiates it, as the Triton twin does.
The convolution always runs the fp16x3p split, whatever GEMM_SCHEME says (the kind has no CUDA-core twin).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from kfuse.backward import class_name, region_inputs
from kfuse.cuda.conv_runtime import CONV_CHANNELS, conv_channels
from kfuse.cuda.epilogue import CudaRegion, recompute_function_source
from kfuse.cuda.glue import Member, bound_name, c_param, cpp_arg, cpp_param, inputs, launcher_head
from kfuse.cuda.spellings import EpilogueArgs, chain_lines, functor_struct
from kfuse.ir import Graph, Node, Region
from kfuse.kernels.conv_geometry import DIRECT_WORK
from kfuse.regions.common import docstring, var
from kfuse.regions.conv_common import TRANSPOSED, conv_flops, form_of, geometry_code, group_channels
from kfuse.regions.kind import numel

DIRECT_SWITCH = "KFUSE_CUDA_CONV_DIRECT"  # "0": no direct tile, when a file is generated


def runs_direct(anchor: Node) -> bool:
    """The direct tile (conv_direct_source.py) where a group has fewer input channels than a record's piece (8,
    depthwise convolutions among them) and at most DIRECT_WORK products a pixel and tap: the Triton backend's
    direct-tile bound (kernels/conv_geometry.py, measured there), not measured for this tile. Decided when the file
    is generated; KFUSE_CUDA_CONV_DIRECT=0 then gives every convolution the implicit-GEMM tile (the A/B)."""
    cin_g, cout_g = group_channels(anchor)
    return os.environ.get(DIRECT_SWITCH, "1") != "0" and cin_g < CONV_CHANNELS and cin_g * cout_g <= DIRECT_WORK


def tile_kernels(anchor: Node) -> str:
    """The kernels a region's convolution runs, for its launcher's docstring."""
    return "kf_conv_direct_kernel" if runs_direct(anchor) else "kf_conv_pack, then kf_conv_fp16x3p_kernel"


def cost_line(region: Region, g: Graph) -> str:
    """What the region's kernels compute and move at the problem's shape (kf_conv_pack, then the tile; or the
    direct tile)."""
    anchor = region.anchor
    x_numel, out_numel = numel(g.shape_of(anchor.args[0])), numel(anchor.shape)
    groups = anchor.attrs.get("groups", 1)
    c_out, c_in = anchor.shape[1], g.shape_of(anchor.args[0])[1]
    taps = numel(tuple(anchor.args[1].shape[2:]))
    cp = conv_channels(c_in // groups)
    flops = conv_flops(anchor, g)
    if runs_direct(anchor):
        moved = 4 * (x_numel + c_out * taps * cp + len(region.outputs) * out_numel)
        return (f"At the problem's shape: {flops / 1e9:.3g} GFLOP as exact products summed in double on CUDA cores; "
                f"{moved / 2 ** 20:.3g} MiB moved at least (x read once, as it is, W's rows once, each output written "
                "once).")
    records = 4 * x_numel // c_in * groups * cp  # bytes: hi and lo fp16 per padded channel
    moved = 2 * 4 * x_numel + 2 * records + 4 * c_out * taps * cp + 4 * len(region.outputs) * out_numel
    return (f"At the problem's shape: {flops / 1e9:.3g} GFLOP, three fp16 products of each on tensor cores "
            f"({3 * flops * cp * groups / c_in / 1e9:.3g} GFLOP with the channels padded to {cp}); "
            f"{moved / 2 ** 20:.3g} MiB "
            "moved at least (x read twice and packed, the records written and read once, W's parts once, each "
            "output written once).")


AT = "m + n * P"  # a functor's NC(D)HW element: the kernels pass m = b C_out P + p and the channel n


def conv_struct(region: Region, struct: str, chain: Sequence[Node] | None = None,
                stored: Sequence[str] | None = None) -> tuple[str, list[Member]]:
    """The functor: acc is the convolution's sum (unscaled); its bias, the `chain` (the region's ops after the
    convolution), each of `stored` (the region's outputs) stored at the NC(D)HW element AT."""
    anchor = region.anchor
    chain = region.nodes[1:] if chain is None else chain
    stored = region.outputs if stored is None else stored
    args = EpilogueArgs()
    env: dict[str, str] = {}
    bias = anchor.args[2]
    first = "acc" if bias is None else f"acc + {args.operand(bias, env)}"
    body = [f"const float {var(anchor.name)} = {first};  // {anchor.origin}"]
    env[anchor.name] = var(anchor.name)
    body += chain_lines(chain, env, args)
    body += [f"out{i}[at] = {env[v]};" for i, v in enumerate(stored)]
    members = [Member(f"out{i}", "out") for i in range(len(stored))]
    doc = "The epilogue of " + " -> ".join(n.origin for n in [anchor, *chain]) + ", on one element of the " \
        "convolution's fp32 accumulator."
    return functor_struct(struct, doc, members, args, body, at=AT, sizes=("P",)), [*members, *args.members]


def launch_params(members: list[Member], prefix: str = "") -> list[str]:
    """The CUDA launcher's parameters: one launch's arguments, the functor's members, the stream."""
    return ["const KfConvArgs& g", *[c_param(m, prefix) for m in members], "cudaStream_t stream"]


def conv_launcher(stem: str, struct: str, members: list[Member], direct: bool) -> str:
    """The CUDA launcher `kf_launch_<stem>(g, members..., stream)`: one launch of the tile with the functor."""
    sets = "\n".join(f"  epi.{m.name} = {m.name};" for m in members)
    return (f"{launcher_head(stem, launch_params(members))} {{\n  {struct} epi;\n{sets}\n"
            f"  epi.P = (long long)g.FD * g.FH * g.FW;\n  return {'kf_conv_direct' if direct else 'kf_conv'}(g, epi, "
            "stream);\n}\n")


def operands_lines(direct: bool) -> list[str]:
    """The bound C++ function's first lines: the device, the tensor inputs are checked against, the launches."""
    operands = ("kf_conv_operands(x, w, torch::Tensor(), launches, cp, out_shape, true)" if direct else
                "kf_conv_operands(x, w, w_scale, launches, cp, out_shape)")
    return ["  const c10::cuda::CUDAGuard guard(x.device());",
            "  [[maybe_unused]] const torch::Tensor& a = x;  // the tensor every input is checked against",
            f"  const KfConvOperands ops = {operands};"]


def conv_params(direct: bool) -> str:
    """The bound C++ function's convolution parameters (the direct tile's: no w_scale)."""
    return (f"torch::Tensor x, torch::Tensor w, {'' if direct else 'torch::Tensor w_scale, '}std::vector<int64_t> "
            "launches, std::vector<int64_t> out_shape, int64_t cp")


def sources(stem: str, struct: str, members: list[Member], direct: bool) -> tuple[str, str]:
    """The CUDA launcher (one launch of the tile) and the bound C++ function `kf_<stem>(x, w, w_scale, launches,
    out_shape, cp, inputs...)` (the direct tile's: no w_scale): x packed once (not for the direct tile), then each
    launch (kfuse/cuda/conv_runtime.py) in turn."""
    function = bound_name(stem)
    outs = [m for m in members if m.kind == "out"]
    cu = conv_launcher(stem, struct, members, direct)
    tensors = "".join(", " + cpp_param(m) for m in inputs(members))
    args = [f"{m.name}.data_ptr<float>()" for m in outs] + [cpp_arg(m) for m in inputs(members)]
    lines = [f"{launcher_head(stem, launch_params(members))};", "",
             f"std::vector<torch::Tensor> {function}({conv_params(direct)}{tensors}) {{",
             *operands_lines(direct),
             *[f"  torch::Tensor {m.name} = torch::empty(out_shape, x.options());" for m in outs],
             "  for (const KfConvArgs& g : ops.launches)",
             f"    kf_check(kf_launch_{stem}(g, {', '.join(args)}, c10::cuda::getCurrentCUDAStream()),",
             f'             "{function}");',
             f"  return {{{', '.join(m.name for m in outs)}}};",
             "}"]
    return cu, "\n".join(lines) + "\n"


def two_stage_function(stem: str, stage: str, direct: bool, params: list[str], launch: list[str],
                       stage_params: list[str], setup: list[str], pre_args: list[str], stage_args: list[str],
                       outputs: list[str]) -> str:
    """The bound C++ function `kf_<stem>` of a convolution kind with a second stage: the convolution's launches
    (its launcher's parameters `launch`, called with `pre_args`), then `kf_launch_<stem>_<stage>` (parameters
    `stage_params`, called with `stage_args`); `params` after the convolution's; `setup`: the lines between the
    operands and the launches (sizes, checks, allocations); returns `outputs`."""
    function = bound_name(stem)
    lines = [f"{launcher_head(stem, launch)};", f"{launcher_head(f'{stem}_{stage}', stage_params)};",
             "",
             f"std::vector<torch::Tensor> {function}({conv_params(direct)}, {', '.join(params)}) {{",
             *operands_lines(direct),
             *setup,
             "  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();",
             "  for (const KfConvArgs& l : ops.launches)",
             f"    kf_check(kf_launch_{stem}(l, {', '.join(pre_args)}, stream), \"{function}\");",
             f"  kf_check(kf_launch_{stem}_{stage}({', '.join(stage_args)}, stream), \"{function}\");",
             f"  return {{{', '.join(outputs)}}};",
             "}"]
    return "\n".join(lines) + "\n"


def launcher_lines(anchor: Node) -> tuple[tuple[str, ...], list[str], str]:
    """(torch's geometry parameters, the Python launcher's first lines: the extension, the geometry, the weight's
    parts and the launches, the bound function's convolution arguments)."""
    geometry = form_of(anchor).geometry  # torch's argument order: (stride, padding, dilation, groups) or transposed's
    parts = "conv_transpose_parts" if anchor.op == TRANSPOSED else "conv_parts"
    direct = runs_direct(anchor)
    head = ["ext = cuda_module()",
            f"geo = {parts.replace('parts', 'geometry')}(tuple(x.shape), tuple(weight.shape), {', '.join(geometry)})",
            f"w, w_scale, cp, launches = {parts}(ext, weight, geo{', direct=True' if direct else ''})"]
    operands = f"x.float().contiguous(), w, {'' if direct else 'w_scale, '}launches, list(geo.out_shape), cp"
    return geometry, head, operands


def function_source(region: Region, stem: str, cls: str, params: list[str], body: list[str], doc: str,
                    values: list[str], extra: Sequence[str] = ()) -> str:
    """`fused_<stem>(params...)` with its `body` and `doc`, then the region's CudaRecomputeFn, whose launch passes x,
    the weight, `values`, torch's geometry arguments and `extra` (a pool's)."""
    anchor = region.anchor
    launcher = "\n".join([f"def fused_{stem}({', '.join(params)}):", docstring(doc), *[f"    {ln}" for ln in body]])
    args = ", ".join([*values, *geometry_code(anchor), *extra])
    launch = f"return fused_{stem}(x, {anchor.args[1].expr()}, {args})"
    return launcher + "\n\n\n" + recompute_function_source(region, stem, cls, launch, "kernels")


def python_source(region: Region, g: Graph, stem: str, cls: str, members: list[Member]) -> str:
    """`fused_<stem>(x, weight, inputs..., <torch's geometry arguments>)` and the region's CudaRecomputeFn."""
    anchor = region.anchor
    fed = inputs(members)
    n_out = len(region.outputs)
    replaced = " -> ".join(n.origin for n in region.nodes)
    geometry, head, operands = launcher_lines(anchor)
    body = [*head, f"got = ext.{bound_name(stem)}({operands}{''.join(', ' + m.name for m in fed)})",
            f"return {'got[0]' if n_out == 1 else 'tuple(got)'}"]
    doc = (f"Fused: {replaced}: the CUDA function `{bound_name(stem)}` ({tile_kernels(anchor)} with Conv_{stem}). "
           f"{cost_line(region, g)}")
    params = ["x", "weight", *[m.name for m in fed], *geometry]
    return function_source(region, stem, cls, params, body, doc, [m.value for m in fed])


def region_code(region: Region, g: Graph, stem: str, classes: set[str]) -> CudaRegion:
    (x,) = region_inputs(region)
    struct = f"Conv_{stem}"
    struct_src, members = conv_struct(region, struct)
    direct = runs_direct(region.anchor)
    cu, cpp = sources(stem, struct, members, direct)
    cls = class_name(stem, classes)
    forward = (f"{', '.join(region.outputs)} = {cls}.run(self, {x})",)
    return CudaRegion(bound_name(stem), struct_src + "\n" + cu, cpp, python_source(region, g, stem, cls, members),
                      forward, ("conv", "conv_direct") if direct else ("conv",))
