"""What every region's code generator shares: kernel parameters, epilogue lines, the GEMM kernel frame.

A region kind (one file of this folder) turns one `Region` into `RegionCode`: kernel source, a launcher function,
and the forward() lines that call it. Generated names start with the region's stem, made from its ops and unique
in the file (emit.py claims it before any code is generated): the kernel for `gemm -> mul -> leaky_relu` is
`linear_mul_leaky_relu_kernel`, its launcher `fused_linear_mul_leaky_relu`.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field

from kfuse.ir import Arg, Graph, Node, Param, Region, Scalar
from kfuse.ops import POINTWISE, VIEW_OPS
from kfuse.regions.sm90_twin import sm90_twin


@dataclass(frozen=True)
class RegionCode:
    kernels: tuple[str, ...]  # Triton kernel sources
    launcher: str  # Python source of the launcher function ("" for torch fallback)
    forward: tuple[str, ...]  # lines of ModelNew.forward
    # forward lines that also bind `z`, the GEMM's output x W^T + b as the kernel computed it (None where
    # this call's path never forms it, e.g. BatchNorm folded into W): the autograd Function saves it for
    # backward instead of recomputing the GEMM (docs/training.md). Empty: the launcher cannot store z.
    z_forward: tuple[str, ...] = ()


def ident(path: str) -> str:
    """A dotted attribute path as part of an identifier: "blocks.0.conv-1.bias" -> "blocks_0_conv_1_bias"."""
    return re.sub(r"\W", "_", path)


def operand_code(a: Arg) -> str:
    """How a launcher call spells a GEMM operand: a parameter read from the model, or a value by its name."""
    return a.expr() if isinstance(a, Param) else str(a)


def var(name: str) -> str:
    """Value names become kernel variables with a prefix, so no user name shadows tl, min, max, ..."""
    return f"v_{name}"


def is_column_vector(p: Param, n: int) -> bool:
    """A parameter that broadcasts along the rows of an (M, N) tile: shape (N,), (1, N), (1, 1, N), ..."""
    return len(p.shape) >= 1 and p.shape[-1] == n and all(d == 1 for d in p.shape[:-1])


def is_single(p: Param) -> bool:
    return all(d == 1 for d in p.shape)


@dataclass
class KernelArgs:
    """Kernel parameters beyond the GEMM operands, each with the launcher expression that feeds it.

    `registry` (value -> name) may be shared by the kernels of one region, so that one launcher parameter
    feeds every kernel that reads the same thing."""

    registry: dict[str, tuple[str, bool]] = field(default_factory=dict)
    params: list[str] = field(default_factory=list)
    values: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)  # kernel lines loading vectors, emitted before the epilogue
    loaded: set[str] = field(default_factory=set)
    # values the region does not compute that its kind admits, read whole at the output offsets (the plain
    # convolution kind's: conv_common.outside_value); any other value missing from the kernel's env is an error
    outside: frozenset[str] = frozenset()

    def add(self, stem: str, value: str, vector: bool) -> str:
        """The kernel parameter fed by `value` (a launcher expression); named after what it reads."""
        if value not in self.registry:
            taken = {n for n, _ in self.registry.values()}
            name = stem if stem not in taken else f"{stem}_{len(taken)}"
            self.registry[value] = (name, vector)
        name = self.registry[value][0]
        if value not in self.values:
            self.params.append(name)
            self.values.append(value)
        return name

    def vector(self, name: str) -> bool:
        return next(v for n, v in self.registry.values() if n == name)

    def operand(self, a: Arg, env: dict[str, str]) -> str:
        """A pointwise op's operand in kernel code: a tile variable, a scalar argument or a loaded vector; one of
        `outside` is loaded whole at the kernel's output offsets `out_offs` under `mask`."""
        if isinstance(a, str):
            if a not in self.outside:
                return env[a]
            name = self.add("v_" + ident(a), f"{a}.contiguous()", True)
            if name not in self.loaded:
                self.loaded.add(name)
                self.loads.append(f"{name} = tl.load({name}_ptr + out_offs, mask=mask, other=0.0).to(tl.float32)")
            return name
        if isinstance(a, Scalar):
            # s_ / p_ prefixes keep user names (a parameter called `b`, a scalar called `N`) off kfuse's own
            stem = "s_" + (ident(a.attr) if a.attr else f"c{len(self.registry)}")
            return self.add(stem, f"float({a.expr()})", False)
        if isinstance(a, Param):
            name = self.add("p_" + ident(a.path), f"as_vector({a.expr()})", True)
            if name not in self.loaded:
                self.loaded.add(name)
                if is_single(a):
                    self.loads.append(f"{name} = tl.load({name}_ptr).to(tl.float32)")
                else:
                    self.loads.append(f"{name} = tl.load({name}_ptr + offs_n, mask=mask_n, other=0.0)"
                                      ".to(tl.float32)[None, :]")
            return name
        raise ValueError(f"operand {a!r} cannot be used in a fused epilogue")

    def signature(self) -> str:
        return "".join(f"{p}_ptr, " if self.vector(p) else f"{p}, " for p in self.params)

    def decls(self) -> tuple[Decl, ...]:
        return plain(*[f"{p}_ptr" if self.vector(p) else p for p in self.params])

    def call(self) -> str:
        return "".join(f"{v}, " for v in self.values)


def pointwise_lines(nodes: list[Node], env: dict[str, str], args: KernelArgs) -> list[str]:
    """Kernel lines computing each pointwise node from the table, in order; binds env[name] -> variable."""
    lines = []
    for n in nodes:
        spec = POINTWISE["identity" if n.op in VIEW_OPS else n.op]  # a view keeps the tile's (M, N) layout
        lines += assign(var(n.name), spec.triton, [args.operand(a, env) for a in n.args], n.origin)
        env[n.name] = var(n.name)
    return lines


def affine_lines(out: str, weight, bias, env: dict[str, str], args: KernelArgs) -> list[str]:
    """GroupNorm's per-channel affine on `out` (each part only where the module has it)."""
    lines = []
    if isinstance(weight, Param):
        lines.append(f"{out} = {out} * {args.operand(weight, env)}")
    if isinstance(bias, Param):
        lines.append(f"{out} = {out} + {args.operand(bias, env)}")
    return lines


def bn_params(bn: Node, channels: int) -> tuple[Param | None, Param | None, Scalar]:
    """A BatchNorm's affine weight and bias (None without affine) and eps, read from its module at run time."""
    affine = bn.attrs.get("affine", True)
    w = Param(f"{bn.module}.weight", (channels,)) if affine else None
    b = Param(f"{bn.module}.bias", (channels,)) if affine else None
    return w, b, Scalar(1e-5, f"{bn.module}.eps")


def bn_normalize(out: str, centred: str, scale: str, w: Param | None, b: Param | None, env: dict[str, str],
                 args: KernelArgs) -> list[str]:
    """`out = centred * scale`, then the BatchNorm's affine where it has one."""
    lines = [f"{out} = {centred} * {scale}"]
    if w is not None:
        lines.append(f"{out} = {out} * {args.operand(w, env)} + {args.operand(b, env)}")
    return lines


def assign(target: str, template: str, operands: list[str], origin: str) -> list[str]:
    """`target = template(operands)  # origin`; a spelling that repeats long operands (mish) reads them through
    short local names first, so the line stays short."""
    line = f"{target} = {template.format(*operands)}  # {origin}"
    if len(line) <= 140:
        return [line]
    short = [f"u_{i}" for i in range(len(operands))]
    return [f"# {origin}", *[f"{s} = {o}" for s, o in zip(short, operands)], f"{target} = {template.format(*short)}"]


def kernel_name(region: Region) -> str:
    return "_".join(dict.fromkeys(n.op for n in region.nodes))


def store_lines(region: Region, env: dict[str, str]) -> list[str]:
    """Store every value read outside the region into its output (out0, out1, ... in region.outputs order)."""
    return [store_line(f"out{i}", env[v]) for i, v in enumerate(region.outputs)]


def store_line(out: str, value: str) -> str:
    return f"tl.store({out}_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], {value}, mask=mask)"


def linear_bias(anchor: Node, env: dict[str, str], args: KernelArgs) -> list[str]:
    """The GEMM node's own epilogue: the bias of nn.Linear / F.linear, if any."""
    bias = anchor.args[2] if anchor.op == "linear" and len(anchor.args) > 2 else None
    if bias is None:
        lines = [f"{var(anchor.name)} = acc"]
    else:
        lines = [f"{var(anchor.name)} = acc + {args.operand(bias, env)}  # bias of {anchor.origin}"]
    env[anchor.name] = var(anchor.name)
    return lines


Decl = tuple[str, str]  # a kernel parameter: its name, and how the signature declares it


def plain(*names: str) -> tuple[Decl, ...]:
    return tuple((n, n) for n in names)


def constexpr(name: str, default: str | None = None) -> Decl:
    return name, f"{name}: tl.constexpr" + ("" if default is None else f" = {default}")


def signature(decls: tuple[Decl, ...] | list[Decl], indent: int = 8, width: int = 116) -> str:
    """The parameter text of `decls`, wrapped at `width` columns with continuation lines indented `indent`."""
    lines, line = [], ""
    for _, text in decls:
        piece = text if not line else f" {text}"
        if line and len(line) + len(piece) + 1 > width - indent:
            lines.append(line)
            line = text
        else:
            line += piece
        line += ","
    lines.append(line.rstrip(","))
    return ("\n" + " " * indent).join(lines)


def names(decls: tuple[Decl, ...] | list[Decl]) -> list[str]:
    return [n for n, _ in decls]


def docstring(doc: str, indent: int = 4, width: int = 116) -> str:
    """A docstring line (or lines) for `doc`, wrapped at `width` columns."""
    pad = " " * indent
    return pad + '"""' + textwrap.fill(doc, width - indent - 6, subsequent_indent=pad).lstrip() + '"""'


def call(fn: str, *args: str | Iterable[str], width: int = 100, indent: int = 8) -> str:
    """`fn(args...)`, each of `args` an expression or several: the arguments wrapped at `width` columns (the
    continuation lines indented `indent` more, inside the parentheses)."""
    flat = [a for group in args for a in ([group] if isinstance(group, str) else group)]
    lines, line = [], f"{fn}("
    for i, a in enumerate(flat):
        piece = a + (", " if i < len(flat) - 1 else "")
        if len(line) + len(piece) > width and line.strip() and not line.endswith("("):
            lines.append(line.rstrip())
            line = " " * indent
        line += piece
    return "\n".join([*lines, line + ")"])


GEMM_PARAMS = plain("a_ptr", "a_lo_ptr", "a_scale_ptr", "b_ptr", "b_lo_ptr", "b_scale_ptr")
GEMM_SIZES = plain("M", "N", "K", "stride_am", "stride_ak", "stride_bn", "stride_bk")
GEMM_CONSTEXPRS = tuple(constexpr(n) for n in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SCHEME", "SPLIT_A",
                                                  "EVEN_K", "K_SLICES"))
BATCH_PARAMS = plain("step_a", "step_a_scale", "step_b", "step_b_scale")


def z_store_body(body: list[str], z_var: str) -> list[str]:
    """`body` with the optional store of the GEMM output z (constexpr STORE_Z) right after the line that
    forms it, so the value is written while it is in registers and not kept alive through the epilogue."""
    at = next((i + 1 for i, ln in enumerate(body) if ln.startswith(f"{z_var} = ")), 0)
    store = ["if STORE_Z:  # z = x W^T + b for backward (saved instead of recomputed: docs/training.md)",
             f"    {store_line('z', z_var)}"]
    return body[:at] + store + body[at:]


def batch_offsets(outs: list[str]) -> list[str]:
    """Kernel lines moving every pointer to product program_id(1) of a batched GEMM (runtime.batched_operands)."""
    return ["pid_b = tl.program_id(1).to(tl.int64)",
            "a_ptr += pid_b * step_a",
            "a_lo_ptr += pid_b * step_a",
            "a_scale_ptr += pid_b * step_a_scale",
            "b_ptr += pid_b * step_b",
            "b_lo_ptr += pid_b * step_b",
            "b_scale_ptr += pid_b * step_b_scale",
            *[f"{o}_ptr += pid_b * M * N" for o in outs]]


def gemm_cost(region: Region, g: Graph) -> str:
    """What the region's GEMM kernel moves and computes at the problem's shape (fp32 operands and outputs)."""
    a = region.anchor
    n = a.shape[-1]
    m = 1
    for d in a.shape[:-1]:
        m *= d
    x = g.shape_of(a.args[0]) if isinstance(a.args[0], str) else ()
    k = x[-1] if x else 0
    w = a.args[1]
    w_shape = w.shape if isinstance(w, Param) else g.shape_of(w) if isinstance(w, str) else ()
    w_numel = 1
    for d in w_shape:
        w_numel *= d
    outs = len(region.outputs)
    moved = 4 * (m * k + w_numel + outs * m * n)
    return (f"At the problem's shape (M={m}, N={n}, K={k}): {2 * m * n * k / 1e9:.3g} GFLOP, {moved / 2 ** 20:.3g} MiB "
            f"moved at fp32 (x and W read once, {outs} output{'s' if outs > 1 else ''} of M x N written once).")


def gemm_kernel(name: str, doc: str, outs: list[str], args: KernelArgs, body: list[str],
                extra_sig: tuple[Decl, ...] = (), z_var: str | None = None, sm90: bool = True,
                batched: bool = False, cost: str = "") -> str:
    """A GEMM tile kernel `<name>_kernel`: tile ids, the fp32-accurate accumulator, then `<name>_epilogue`, a jit
    function running `body` (epilogue + stores) on it, which the Hopper twin calls too.
    extra_sig: more parameters (plain() or constexpr() declarations), before the tile constexprs.
    z_var: the variable holding x W^T + b; the kernel then takes `z_ptr` and STORE_Z (write z too).
    sm90: also its Hopper twin `<name>_kernel_sm90` (regions/sm90_twin.py), which launchers pick for sm90 configs.
    batched: B products, one per program_id(1), each M x N (no twin: runtime.tuned_gemm offers none).
    cost: what it moves and computes (gemm_cost), added to its docstring."""
    doc = f"{doc} {cost}" if cost else doc
    outs_sig = plain(*[f"{o}_ptr" for o in outs], *(["z_ptr"] if z_var else []))
    decls = (*GEMM_PARAMS, *outs_sig, *args.decls(), *GEMM_SIZES, *(BATCH_PARAMS if batched else ()), *extra_sig,
             *GEMM_CONSTEXPRS, *([constexpr("STORE_Z", "False")] if z_var else []))
    if z_var:
        body = z_store_body(body, z_var)
    offsets = batch_offsets([*outs, *(["z"] if z_var else [])]) if batched else []
    epilogue = ["mask_m = offs_m < M", "mask_n = offs_n < N", "mask = mask_m[:, None] & mask_n[None, :]",
                *args.loads, *body]
    kernel = [
        "@triton.jit",
        f"def {name}_kernel({signature(decls)}):",
        docstring(doc),
        *[f"    {ln}" for ln in offsets],
        "    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)",
        "    acc = gemm_tile(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, pid_m, pid_n, M, N, K,",
        "                    stride_am, stride_ak, stride_bn, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, SPLIT_A,",
        "                    EVEN_K, K_SLICES=K_SLICES)",
        "    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "    " + call(f"{name}_epilogue", ["acc", "pid_m", "pid_n", "offs_m", "offs_n"], names(decls)),
    ]
    src = (epilogue_fn(name, plain("acc", "pid_m", "pid_n", "offs_m", "offs_n"), decls, epilogue) + "\n\n"
           + "\n".join(kernel) + "\n")
    return src + "\n\n" + sm90_twin(name, decls, doc) if sm90 and not batched else src


def epilogue_fn(name: str, head: tuple[Decl, ...], decls: tuple[Decl, ...], lines: list[str]) -> str:
    """`<name>_epilogue`: a tile kernel's `lines` after its tile, a jit function the kernel and its Hopper twin both
    call; its parameters the tile's accumulator, ids and offsets (`head`), then the kernel's."""
    doc = f'    """The epilogue of {name}_kernel (and of its Hopper twin) on the tile\'s fp32 accumulator."""'
    return "\n".join(["@triton.jit", f"def {name}_epilogue({signature([*head, *decls])}):", doc,
                      *[f"    {ln}" for ln in lines]]) + "\n"


def gemm_launch(kernel: str, *args: str | Iterable[str]) -> str:
    """The launch of GEMM kernel `kernel` (its name stem, made by gemm_kernel with its twin) with `args` (then the
    tile config's) under `cfg`: the Hopper twin for sm90 configs."""
    return call(f"pick_kernel({kernel}_kernel, {kernel}_kernel_sm90, cfg)[grid]", *args, LAUNCH_TAIL)


# what a launcher called with save_z=True returns after its outputs (runtime.saved_for_backward): z = x W^T + b, and
# x's split where the GEMM made one; the generated Function's launch_z hands it to backward
KEPT = "saved_for_backward(z.reshape(*lead, N), ops, scheme, cfg)"
SAVE_Z_DOC = "save_z: also return what backward keeps (z = x W^T + b and x's split: runtime.saved_for_backward)."

LAUNCH_TAIL = ("BLOCK_M=cfg.block_m", "BLOCK_N=cfg.block_n", "BLOCK_K=cfg.block_k", "GROUP_M=cfg.group_m",
               "SCHEME=tile_scheme(scheme, cfg)", "SPLIT_A=cfg.split_a", "EVEN_K=k_run % cfg.block_k == 0",
               "K_SLICES=cfg.k_slices", "num_warps=cfg.num_warps", "num_stages=cfg.num_stages",
               "**sm90_options(cfg, M, N, k_run, x.device)")


def launcher(name: str, params: list[str], body: list[str], doc: str) -> str:
    head = f"def {name}({signature(plain(*params))}):"
    return "\n".join([head, docstring(doc)] + [f"    {ln}" for ln in body]) + "\n"


def gemm_head(anchor: Node) -> list[str]:
    """Launcher lines: x as (M, K), M, K, N and the scheme. Expects `x` and `weight` to be defined."""
    return ["lead = x.shape[:-1]",
            "x2 = x.reshape(-1, x.shape[-1])",
            f"M, K, N = x2.shape[0], x2.shape[1], weight.shape[{1 if anchor.op == 'matmul' else 0}]",
            "scheme = gemm_scheme(x2)"]


def gemm_operand_lines(anchor: Node) -> list[str]:
    """Launcher lines for a chosen `cfg`: the GEMM operands and the tile grid."""
    # a parameter's split is cached until it changes; a value's (`a @ b` of two inputs) is made on every call
    operands = "gemm_operands" if isinstance(anchor.args[1], Param) else "product_operands"
    return [f"ops, k_run, strides = {operands}(x2, weight, {anchor.op == 'matmul'}, scheme, cfg)",
            "grid = gemm_grid(M, N, cfg, x.device)"]


def gemm_prologue(anchor: Node, kernel: str) -> list[str]:
    """Launcher lines: x as (M, K), the scheme and the default tile config (no tuning; recorded for `kernel`'s
    launch, the tuner's chosen_configs), the GEMM operands, the tile grid. Expects `x`, `weight` and `min_block_n`
    (the epilogue's smallest column tile) to be defined."""
    return [*gemm_head(anchor), f"cfg = gemm_config(M, N, K, scheme, min_block_n, kernel={kernel})",
            *gemm_operand_lines(anchor)]


def tuned_launch_lines(anchor: Node, kernel: str, body: list[str], results: list[str]) -> list[str]:
    """Launcher lines (after gemm_head and `min_block_n`) running `body` (allocations and the launch of
    `kernel`, which must write only what `body` allocates) inside `launch(cfg)` under the config `tuned_gemm`
    picks (autotuned on a GPU the first time the shape is seen); binds `cfg` and the `results` names."""
    names = ", ".join(results) + ","
    inner = [*gemm_operand_lines(anchor), *body, f"return ({names})"]
    return ["def launch(cfg):", *[f"    {ln}" for ln in inner],
            f"cfg, ({names}) = tuned_gemm({kernel}_kernel, x2, N, scheme, min_block_n, launch)"]


def batched_region_code(region: Region, name: str, args: KernelArgs, body: list[str], doc: str,
                        cost: str = "") -> RegionCode:
    """Kernel + launcher + forward line for a batched product x[..., M, K] @ w[..., K, N] (the same leading dims)
    and its epilogue: one launch, program_id(1) picking the product."""
    anchor = region.anchor
    outs = [f"out{i}" for i in range(len(region.outputs))]
    kernel = gemm_kernel(name, doc, outs, args, body, z_var=var(anchor.name), batched=True, cost=cost)
    tail = ["K_SLICES=0" if kw == "K_SLICES=cfg.k_slices" else kw for kw in LAUNCH_TAIL]
    launch_body = [*[f"{o} = torch.empty((B * M, N), device=x.device, dtype=x.dtype)" for o in outs],
                   f"z = torch.empty((B * M, N), device=x.device, dtype=x.dtype) if save_z else {outs[0]}"
                   "  # unused if not",
                   "ops, k_run, strides, steps = batched_operands(x3, w3, scheme, cfg)",
                   "grid = (gemm_grid(M, N, cfg, x.device)[0], B)",
                   call(f"{name}_kernel[grid]", ["*ops", *outs, "z", *args.params, "M", "N", "k_run", "*strides",
                                                   "*steps", "STORE_Z=save_z"], tail),
                   f"return ({', '.join([*outs, 'z'])},)"]
    lines = ["min_block_n = 16",
             "lead = x.shape[:-1]",
             "x3 = x.reshape(-1, x.shape[-2], x.shape[-1])",
             "w3 = weight.reshape(-1, weight.shape[-2], weight.shape[-1])",
             "B, M, K, N = x3.shape[0], x3.shape[1], x3.shape[2], w3.shape[2]",
             "x2 = x3.reshape(B * M, K)",
             "scheme = gemm_scheme(x2)",
             "def launch(cfg):", *[f"    {ln}" for ln in launch_body],
             f"cfg, ({', '.join([*outs, 'z'])},) = "
             + call("tuned_gemm", [f"{name}_kernel", "x2", "N", "scheme", "min_block_n", "launch", "batch=B"])]
    shaped = ", ".join(f"{o}.reshape(*lead, N)" for o in outs)
    lines += ["if save_z:", f"    return {shaped}, (z.reshape(*lead, N),)", f"return {shaped}"]
    launch = launcher(f"fused_{name}", ["x", "weight", *args.params, "save_z=False"], lines, doc + f" {SAVE_Z_DOC}")
    line = call(f"fused_{name}", [anchor.args[0], operand_code(anchor.args[1]), *args.values])
    return RegionCode((kernel,), launch, (f"{', '.join(region.outputs)} = {line}",))


def gemm_region_code(region: Region, name: str, args: KernelArgs, body: list[str], doc: str, *,
                     extra_sig: tuple[Decl, ...] = (), extra_kwargs: tuple[str, ...] = (),
                     pre: tuple[str, ...] = ("min_block_n = 16",), cost: str = "",
                     extra_params: tuple[str, ...] = (), extra_values: tuple[str, ...] = ()) -> RegionCode:
    """Kernel + launcher + forward line for a single-kernel GEMM region.

    The launcher flattens x to (M, K), picks the scheme and tile config, prepares the GEMM operands (cached
    weight split), allocates one contiguous (M, N) output per value read outside the region and launches.
    `pre`: launcher lines run first (they must set `min_block_n`); `extra_params`/`extra_values`: launcher
    parameters and the forward expressions feeding them; `extra_sig`/`extra_kwargs`: kernel constexprs."""
    anchor = region.anchor
    outs = [f"out{i}" for i in range(len(region.outputs))]
    kernel = gemm_kernel(name, doc, outs, args, body, extra_sig, z_var=var(anchor.name), cost=cost)
    body = [f"{o} = torch.empty((M, N), device=x.device, dtype=x.dtype)" for o in outs]
    body.append(f"z = torch.empty((M, N), device=x.device, dtype=x.dtype) if save_z else {outs[0]}  # unused if not")
    body.append(gemm_launch(name, ["*ops", *outs, "z", *args.params, "M", "N", "k_run", "*strides", *extra_kwargs,
                                   "STORE_Z=save_z"]))
    lines = [*pre, *gemm_head(anchor), *tuned_launch_lines(anchor, name, body, [*outs, "z", "ops"])]
    shaped = ", ".join(f"{o}.reshape(*lead, N)" for o in outs)
    lines += ["if save_z:", f"    return {shaped}, {KEPT}", f"return {shaped}"]
    launch = launcher(f"fused_{name}", ["x", "weight", *extra_params, *args.params, "save_z=False"], lines,
                      doc + f" {SAVE_Z_DOC}")
    weight = anchor.args[1]
    call_args = [anchor.args[0], operand_code(weight), *extra_values, *args.values]
    return forward_calls(region, f"fused_{name}", call_args, launch, (kernel,))


def forward_calls(region: Region, launcher_name: str, args: list[str], launch: str,
                  kernels: tuple[str, ...]) -> RegionCode:
    """RegionCode whose forward line calls the launcher with `args`, and whose z_forward line also asks it for
    what backward keeps (save_z=True)."""
    outs = ", ".join(region.outputs)
    return RegionCode(kernels, launch, (f"{outs} = " + call(launcher_name, args),),
                      z_forward=(f"{outs}, kept = " + call(launcher_name, args, ["save_z=True"]),))


def pointwise_kernel(name: str, doc: str, ins: list[str], outs: list[str], args: KernelArgs, body: list[str],
                     extra_sig: tuple[Decl, ...] = ()) -> str:
    """A 2-d elementwise kernel over (M, N) row-major tensors: load `ins` tiles as v_<in>, run `body`.
    `extra_sig`: more parameters, after M, N (e.g. plain("GROUP", "NUM_GROUPS"))."""
    decls = (*plain(*[f"{p}_ptr" for p in [*ins, *outs]]), *args.decls(), *plain("M", "N"), *extra_sig,
             constexpr("BLOCK_M"), constexpr("BLOCK_N"))
    lines = [
        "@triton.jit",
        f"def {name}_kernel({signature(decls)}):",
        docstring(doc),
        "    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
        "    mask_m = offs_m < M",
        "    mask_n = offs_n < N",
        "    mask = mask_m[:, None] & mask_n[None, :]",
        "    tile = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]",
    ]
    lines += [f"    v_{i} = tl.load({i}_ptr + tile, mask=mask, other=0.0).to(tl.float32)" for i in ins]
    lines += [f"    {ln}" for ln in args.loads + body]
    return "\n".join(lines) + "\n"
