"""The Hopper twin of a generated GEMM kernel (`<name>_kernel_sm90`), made from the same pieces as the kernel.

Same parameters (plus STAGES, CHUNK and PERSISTENT of the sm90 configs) and the same epilogue, the jit function
`<name>_epilogue` both call (regions/common.gemm_kernel), compiled by Gluon with the tile of kernels/gemm_sm90.py:
asynchronous wgmma fed by a producer warp. The twin makes the tile's row and column offsets with Gluon's arange
(no layout given: the compiler infers it from the accumulator's), so the epilogue makes no tensor of its own
layout. Two functions:
  <name>_tiles_sm90     persistent blocks: the consumer warps walk the block's tiles, each tile's K loop
                        (sm90_tile_mma) then its epilogue, while the producer warp (sm90_loader) already loads the next
                        tile: a tile's prologue and pipeline fill overlap the previous epilogue. The epilogue then runs
                        on the accumulator's own layout (the stages' shared memory stays busy, none is left for a layout
                        change): epilogues that reshape it (GroupNorm's groups) do not compile, and the tuner keeps
                        the one-tile twin for them;
                        With TAIL (runtime.sm90_options sets it where the last wave is a few tiles), the blocks
                        then split that wave's tiles along K, the last to finish each one sums the slices and runs
                        its epilogue (kernels/gemm_sm90.py: sm90_tail_piece, sm90_tail_done, sm90_tail_sum);
  <name>_kernel_sm90    the kernel: PERSISTENT, the above under warp_specialize; else one tile per block
                        (gemm_tile_sm90) and the epilogue on a blocked layout.
Launchers pick the twin for sm90 configs (runtime.pick_kernel, sm90_options, gemm_grid).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kfuse.regions.common import Decl

# the epilogue's call in the twin: the tile's offsets made with Gluon's arange
OFFSETS = ("pid_m * BLOCK_M + gl.arange(0, BLOCK_M)", "pid_n * BLOCK_N + gl.arange(0, BLOCK_N)")


def sm90_twin(name: str, decls: tuple[Decl, ...], doc: str) -> str:
    """The twin's source: `decls` are the kernel's parameters; the epilogue is `<name>_epilogue`."""
    from kfuse.regions.common import call, docstring, signature

    params = signature(decls)
    names = [n for n, _ in decls]
    epilogue_call = call(f"{name}_epilogue", ["acc", "pid_m", "pid_n", *OFFSETS], names, indent=12)
    setup = ("sm90_setup(a_ptr, a_lo_ptr, b_ptr, b_lo_ptr, M, N, K, stride_am, stride_bn, BLOCK_M, BLOCK_N, "
             "BLOCK_K, STAGES)")
    lines = [
        "@sm90_jit",
        f"def {name}_tiles_sm90(st, STAGES: tl.constexpr, CHUNK: tl.constexpr, TAIL: tl.constexpr, tail_split, "
        "tail_ws, tail_cnt,",
        f"        {params}):",
        f'    """{name}_kernel_sm90\'s consumer warps on a persistent grid: each of the block\'s tiles, then its '
        'epilogue;',
        '    with TAIL, then its slice of a tail tile (the last wave\'s, split along K: kernels/gemm_sm90.py)."""',
        "    n_k = tl.cdiv(K, BLOCK_K)",
        "    i = 0",
        "    for tile in range(tl.program_id(0), sm90_full_tiles(M, N, BLOCK_M, BLOCK_N, TAIL), tl.num_programs(0)):",
        "        pid_m, pid_n = _tile_ids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)",
        "        acc = sm90_tile_mma(st, i, n_k, BLOCK_M, BLOCK_N, STAGES, CHUNK)",
        "        acc = sm90_scaled(acc, a_scale_ptr, b_scale_ptr, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)",
        f"        {epilogue_call}",
        "        i += n_k",
        "    if TAIL:",
        "        tile, slot, j, kb0, kb1 = sm90_tail_piece(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, tail_split)",
        "        if kb1 > kb0:",
        "            acc = sm90_tile_mma(st, i, kb1 - kb0, BLOCK_M, BLOCK_N, STAGES, CHUNK)",
        "            if sm90_tail_done(acc, slot, j, tail_ws, tail_cnt, tail_split, BLOCK_M, BLOCK_N):",
        "                pid_m, pid_n = _tile_ids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)",
        "                acc = sm90_tail_sum(acc, slot, tail_ws, tail_split, BLOCK_M, BLOCK_N)",
        "                acc = sm90_scaled(acc, a_scale_ptr, b_scale_ptr, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)",
        f"                {epilogue_call}",
        "",
        "",
        "# the same kernel with its GEMM tile in Gluon, for Hopper GPUs (sm90 configs: regions/sm90_twin.py)",
        "@sm90_jit",
        f"def {name}_kernel_sm90({params}, STAGES: tl.constexpr = 3, CHUNK: tl.constexpr = 4,",
        "        PERSISTENT: tl.constexpr = False, TAIL: tl.constexpr = False, tail_split=1, tail_ws=None,",
        "        tail_cnt=None):",
        docstring(doc),
        '    tl.static_assert(SCHEME == "fp16x3p" and not SPLIT_A and EVEN_K, "the sm_90 tile: pre-split operands")',
        "    if PERSISTENT:  # one block per SM walks the tiles; its producer warp loads across tile boundaries",
        f"        st = {setup}",
        "        gl.warp_specialize([",
        "            (" + call(f"{name}_tiles_sm90, ", ["st", "STAGES", "CHUNK", "TAIL", "tail_split", "tail_ws",
                                                             "tail_cnt"], names, indent=16) + "),",
        "            (sm90_loader, (st, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES, TAIL, tail_split))],",
        "            [1], [24])",
        "    else:",
        "        pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)",
        "        acc = gemm_tile_sm90(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, pid_m, pid_n,",
        "                             M, N, K, stride_am, stride_ak, stride_bn, stride_bk, BLOCK_M, BLOCK_N,",
        "                             BLOCK_K, SCHEME, SPLIT_A, EVEN_K, GROUP_M=GROUP_M, STAGES=STAGES, CHUNK=CHUNK)",
        f"        {epilogue_call}",
    ]
    return "\n".join(lines) + "\n"
