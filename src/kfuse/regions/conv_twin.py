"""The Hopper twin of a generated convolution kernel (`<name>_kernel_sm90`): the same parameters and the same
epilogue (`<name>_epilogue`, a jit function the Triton kernel calls too), on kernels/conv_sm90.py's Gluon tile.

The twin is persistent: a block per SM walks the tiles of wide rows (kernels/conv_sm90.py), its consumer warps
running each tile's K loop (gemm_sm90.sm90_tile_mma) and then the epilogue on the accumulator's own layout, while
the producer warp (conv_sm90_loader) already loads the next tile. The tile's row offsets are the output pixels of
its wide rows (wide_rows: rows that are none are masked like rows past M), its channel offsets made with Gluon's
arange (no layout given: the compiler infers it from the accumulator's). Which kernels get one (twin_ok): the plain
convolution tile's form (a buffer per row tile must count the twin's rows: conv_config.conv_row_tiles), and an
epilogue that makes no tensor of its own (tl.arange, tl.zeros, tl.full) and reads no group from the grid.
Launchers of such kernels plan with sm90=True (kernels/conv.py conv_plan) and run pick_conv's kernel.
"""

from __future__ import annotations

from kfuse.regions.common import Decl, call, docstring, names, plain, signature

# the epilogue's parameters before the kernel's own: the tile's accumulator, ids and offsets
EPILOGUE_HEAD = plain("acc", "pid_m", "pid_n", "g", "offs_m", "mask_m", "offs_c")
# what an epilogue may not hold to get a twin: tensors of its own layout; the group's grid dim (the twin's grid is a
# block per SM, groups walked as tiles; program_id(2) is 0 in both, as a convolution's Triton grid has two dims)
_NOT_IN_TWINS = ("tl.arange", "tl.zeros", "tl.full", "program_id(1)", "num_programs(1)")
_TILE_SIZES = "M, C_in, OD, OH, OW, CIN_G, COUT_G, KD, KH, KW, DD, DH, DW, BLOCK_M, BLOCK_N, BLOCK_K"


def twin_ok(plain_tile: bool, lines: list[str]) -> bool:
    """Whether a kernel whose epilogue is `lines` gets a Hopper twin (module docstring); `plain_tile`: its form runs
    the plain convolution tile (regions/conv_common.CONV's)."""
    return plain_tile and not any(t in ln for ln in lines for t in _NOT_IN_TWINS)


def epilogue_call(name: str, decls: tuple[Decl, ...], offsets: tuple[str, str, str], indent: int) -> str:
    return call(f"{name}_epilogue", ["acc", "pid_m", "pid_n", "g", *offsets], names(decls), indent=indent)


def conv_twin(name: str, decls: tuple[Decl, ...], doc: str) -> str:
    """The twin's source: `decls` are the kernel's parameters (the plain convolution's operands and sizes among
    them)."""
    params = signature(decls)
    offsets = ("offs_m", "mask_m", "pid_n * BLOCK_N + gl.arange(0, BLOCK_N)")
    lines = [
        "@sm90_jit",
        f"def {name}_tiles_sm90(st, STAGES: tl.constexpr, CHUNK: tl.constexpr,",
        f"        {params}):",
        f'    """{name}_kernel_sm90\'s consumer warps: each of the block\'s tiles, its K loop, then its epilogue."""',
        "    N, Dp, Hp, Wp, CP, NCB, n_k, row_tiles, col_tiles = conv_sm90_plan(",
        f"        {_TILE_SIZES})",
        "    i = 0",
        "    for tile in range(tl.program_id(0), row_tiles * col_tiles * (C_in // CIN_G), tl.num_programs(0)):",
        "        pid_m, pid_n, g = conv_sm90_tile_ids(tile, row_tiles, col_tiles)",
        "        acc = sm90_tile_mma(st, i, n_k, BLOCK_M, BLOCK_N, STAGES, CHUNK)",
        "        acc = conv_sm90_scaled(acc, x_scale_ptr, w_scale_ptr, pid_m, pid_n, g, N, Dp * Hp * Wp, COUT_G,",
        "                               BLOCK_M, BLOCK_N)",
        "        offs_m, mask_m = wide_rows(pid_m * BLOCK_M + gl.arange(0, BLOCK_M), N, OD, OH, OW, Dp, Hp, Wp)",
        "        " + epilogue_call(name, decls, offsets, indent=12),
        "        i += n_k",
        "",
        "",
        "# the same kernel with its convolution tile in Gluon, for Hopper GPUs (sm90 configs: regions/conv_twin.py)",
        "@sm90_jit",
        f"def {name}_kernel_sm90({params}, STAGES: tl.constexpr = 3, CHUNK: tl.constexpr = 4):",
        docstring(doc),
        "    st = conv_sm90_setup(x_ptr, w_ptr, w_lo_ptr, stride_wn, M, C_in, OD, OH, OW, C_out, CIN_G, KD, KH, KW, "
        "DD, DH, DW,",
        "                         BLOCK_M, BLOCK_N, BLOCK_K, STAGES)",
        "    gl.warp_specialize([",
        "        (" + call(f"{name}_tiles_sm90, ", ["st", "STAGES", "CHUNK"], names(decls), indent=12) + "),",
        "        (conv_sm90_loader, (st, M, OD, OH, OW, C_in, CIN_G, COUT_G, KD, KH, KW, DD, DH, DW, BLOCK_M, "
        "BLOCK_N,",
        "                            BLOCK_K, STAGES)),",
        "    ], [1], [24])",
    ]
    return "\n".join(lines) + "\n"
