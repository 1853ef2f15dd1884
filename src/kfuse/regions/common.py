"""What every region's code generator shares: kernel parameters, epilogue lines, the GEMM kernel frame.

A region kind file (gemm_epilogue.py, gemm_groupnorm.py, gemm_batchnorm.py, torch_fallback.py) turns one
`Region` into `RegionCode`: kernel source, a launcher function, and the forward() lines that call it.
Generated names follow the values: the kernel for `gemm -> mul -> leaky_relu` is
`linear_mul_leaky_relu_kernel`, its launcher `linear_mul_leaky_relu`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kfuse.ir import Arg, Graph, Node, Param, Scalar
from kfuse.ops import POINTWISE
from kfuse.partition import Region


@dataclass(frozen=True)
class RegionCode:
    kernels: tuple[str, ...]  # Triton kernel sources
    launcher: str  # Python source of the launcher function ("" for torch fallback)
    forward: tuple[str, ...]  # lines of ModelNew.forward


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
    """Kernel parameters beyond the GEMM operands, each with the launcher expression that feeds it."""

    params: list[str] = field(default_factory=list)
    values: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)  # kernel lines loading vectors, emitted before the epilogue
    loaded: set[str] = field(default_factory=set)
    vectors: list[bool] = field(default_factory=list)  # which params are pointers

    def add(self, stem: str, value: str, vector: bool) -> str:
        """The kernel parameter fed by `value` (a launcher expression); named after what it reads."""
        if value in self.values:  # the same scale or parameter used twice is passed once
            return self.params[self.values.index(value)]
        name = stem if stem not in self.params else f"{stem}_{len(self.params)}"
        self.params.append(name)
        self.values.append(value)
        self.vectors.append(vector)
        return name

    def operand(self, a: Arg, env: dict[str, str]) -> str:
        """A pointwise op's operand in kernel code: a tile variable, a scalar argument or a loaded vector."""
        if isinstance(a, str):
            return env[a]
        if isinstance(a, Scalar):
            stem = a.attr.replace(".", "_") if a.attr else f"c{len(self.params)}"
            return self.add(stem, f"float({a.expr()})", False)
        if isinstance(a, Param):
            name = self.add(a.path.replace(".", "_"), f"as_vector({a.expr()})", True)
            if name not in self.loaded:
                self.loaded.add(name)
                if is_single(a):
                    self.loads.append(f"{name} = tl.load({name}_ptr).to(tl.float32)")
                else:
                    self.loads.append(f"{name} = tl.load({name}_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]")
            return name
        raise ValueError(f"operand {a!r} cannot be used in a fused epilogue")

    def signature(self) -> str:
        return "".join(f"{p}_ptr, " if v else f"{p}, " for p, v in zip(self.params, self.vectors))

    def call(self) -> str:
        return "".join(f"{v}, " for v in self.values)


def pointwise_lines(nodes: list[Node], env: dict[str, str], args: KernelArgs) -> list[str]:
    """Kernel lines computing each pointwise node from the table, in order; binds env[name] -> variable."""
    lines = []
    for n in nodes:
        spec = POINTWISE[n.op]
        operands = [args.operand(a, env) for a in n.args]
        lines.append(f"{var(n.name)} = {spec.triton.format(*operands)}  # {n.origin}")
        env[n.name] = var(n.name)
    return lines


def kernel_name(region: Region) -> str:
    return "_".join(dict.fromkeys(n.op for n in region.nodes))


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


GEMM_PARAMS = ("a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, ")
GEMM_CONSTEXPRS = ("BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, "
                   "SCHEME: tl.constexpr, SPLIT_A: tl.constexpr, EVEN_K: tl.constexpr")


def gemm_kernel(name: str, doc: str, outs: list[str], args: KernelArgs, body: list[str], extra_sig: str = "") -> str:
    """A GEMM tile kernel: tile ids, the fp32-accurate accumulator, masks, then `body` (epilogue + stores)."""
    out_sig = "".join(f"{o}_ptr, " for o in outs)
    lines = [
        "@triton.jit",
        f"def {name}_kernel({GEMM_PARAMS}{out_sig}{args.signature()}M, N, K,",
        f"        stride_am, stride_ak, stride_bn, stride_bk, {extra_sig}{GEMM_CONSTEXPRS}):",
        f'    """{doc}"""',
        "    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)",
        "    acc = gemm_tile(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, pid_m, pid_n, M, N, K,",
        "                    stride_am, stride_ak, stride_bn, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, SPLIT_A, EVEN_K)",
        "    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "    mask_m = offs_m < M",
        "    mask_n = offs_n < N",
        "    mask = mask_m[:, None] & mask_n[None, :]",
    ]
    lines += [f"    {ln}" for ln in args.loads + body]
    return "\n".join(lines) + "\n"


def gemm_setup(anchor: Node, g: Graph) -> tuple[str, list[str]]:
    """The launcher's opening lines: flatten x to (M, K), pick scheme and config, build the GEMM operands.
    Returns the weight expression the forward passes and the lines."""
    weight: Param = anchor.args[1]
    kn = anchor.op == "matmul"
    n_dim = 1 if kn else 0
    lines = [
        "lead = x.shape[:-1]",
        "x2 = x.reshape(-1, x.shape[-1])",
        f"M, K, N = x2.shape[0], x2.shape[1], weight.shape[{n_dim}]",
        "scheme = gemm_scheme(x2)",
        "cfg = gemm_config(M, N, K, scheme, min_block_n)",
        f"ops, strides = gemm_operands(x2, weight, {kn}, scheme, cfg)",
        "grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)",
    ]
    return weight.expr(), lines


LAUNCH_TAIL = ("M, N, K, *strides, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, "
               "GROUP_M=cfg.group_m, SCHEME=scheme, SPLIT_A=cfg.split_a, EVEN_K=K % cfg.block_k == 0, "
               "num_warps=cfg.num_warps, num_stages=cfg.num_stages")


def launcher(name: str, params: list[str], body: list[str], doc: str) -> str:
    head = f"def {name}({', '.join(params)}):"
    return "\n".join([head, f'    """{doc}"""'] + [f"    {ln}" for ln in body]) + "\n"
