"""The convolution tile's configs (kernels/conv.py, conv_sm90.py, conv_transpose.py, conv_depthwise.py): the default
tile of each scheme and geometry, the candidates the tuner times on a GPU's first call at each geometry (kept in its
disk cache), the Hopper tile's configs and launch options, and the grid of one launch."""

from __future__ import annotations

import dataclasses

import torch
import triton

from kfuse.kernels.conv_geometry import ConvGeometry
from kfuse.kernels.conv_pack import DENSE_K_ALIGN, INTERPRETER_ELEMENTS, packed_channels
from kfuse.kernels.gemm_core import _num_sms, cdiv, sm90_maxnreg
from kfuse.kernels.runtime import SETTINGS, TUNER, _kernel_hash, _kernel_name

DIRECT_SCHEMES = ("direct64", "direct32")  # the direct tile (kernels/conv_direct.py): float64 or fp32 sums


@dataclasses.dataclass(frozen=True)
class ConvConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    sm90: bool = False  # kernels/conv_sm90.py's Gluon tile on wide rows (num_stages: its STAGES)

    def short(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k}_w{self.num_warps}_s{self.num_stages}" + (
            "_sm90" if self.sm90 else "")


def k_block(geo: ConvGeometry, cap: int) -> int:
    """The deepest K block up to `cap` that divides a tap's packed channels (CP): a block never straddles taps,
    and none is all padding. Dense K: 32 (DENSE_K_ALIGN, which divides the im2col rows), or 16 where `cap` is."""
    if geo.dense:
        return min(max(cap, 16), DENSE_K_ALIGN.value)
    cp = packed_channels(geo.CIN_G)
    return min(cap, cp & -cp)  # the largest power of two dividing CP (>= PACK)


def conv_config(geo: ConvGeometry, scheme: str, interpret: bool) -> ConvConfig:
    """The tile config of a convolution (the tuner's default on a GPU: tuned_conv). Column tiles cover the group's
    channels up to 128 (depthwise: 16, the narrowest tl.dot takes); fp16x3p keeps two fp32 accumulators (partial +
    sum), so its tiles stay at 128 x 128 or less. K blocks: k_block. The direct tile: direct_config."""
    if scheme in DIRECT_SCHEMES:
        return direct_config(geo, interpret)
    block_n = min(max(triton.next_power_of_2(geo.COUT_G), 16), 128)
    if interpret:
        block_n = min(block_n, 64)
        rows = min(max(triton.next_power_of_2(geo.M), 16), INTERPRETER_ELEMENTS // max(block_n, 32))
        return ConvConfig(rows, block_n, 16 if scheme == "fp64" else k_block(geo, 64), 4, 1)
    # 64 x 128 at 4 warps: two fp32 accumulators of 64 registers each per thread; on an H100 within 8% of the
    # best tile on the problems timed (CONV_TUNE_TILES: the tuner's other choices)
    return ConvConfig(64, block_n, k_block(geo, 32), 4, 3 if scheme == "fp16x3p" else 2)


def direct_config(geo: ConvGeometry, interpret: bool) -> ConvConfig:
    """The direct tile's (BLOCK_K unused: the channels and taps are loops): columns cover the group's channels up to
    64, rows fill 8192 accumulators a program (64 registers a thread at 4 warps in float64); in the interpreter as many
    rows as INTERPRETER_ELEMENTS allows (its cost is per tl op, not per element)."""
    block_n = min(triton.next_power_of_2(geo.COUT_G), 64)
    if interpret:
        return ConvConfig(min(triton.next_power_of_2(geo.M), INTERPRETER_ELEMENTS // block_n), block_n, 16, 4, 1)
    return ConvConfig(max(8192 // block_n, 64), block_n, 16, 4, 1)


def sm90_config(geo: ConvGeometry) -> ConvConfig:
    """The Gluon tile's default (kernels/conv_sm90.py): 128 rows over 8 consumer warps, the group's channels up to
    128, K blocks of up to 64 channels of a tap; stages as many as fit one block per SM (SM90_SMEM)."""
    return _sm90_tile(geo, 128, 128, 64, 8)


SM90_SMEM = 200 * 1024  # the stages' bytes (the SM's 227 KB, less the epilogue's layout change and barriers)


def _sm90_tile(geo: ConvGeometry, rows: int, cols: int, depth: int, warps: int) -> ConvConfig:
    block_n = min(max(triton.next_power_of_2(geo.COUT_G), 16), cols)
    block_k = k_block(geo, depth)
    stage = 2 * 2 * (rows + block_n) * block_k  # hi and lo fp16 blocks of both operands
    return ConvConfig(rows, block_n, block_k, warps, max(2, min(4, SM90_SMEM // stage)), sm90=True)


# The Gluon tile's (rows, columns, K depth, warps) the tuner tries besides sm90_config's.
SM90_TUNE_TILES = ((128, 64, 64, 8), (64, 128, 64, 4), (128, 128, 32, 8))


def conv_options(cfg: ConvConfig) -> dict:
    """A launch's extra arguments for cfg: the Gluon tile's stages and register cap (gemm_core.sm90_maxnreg, at
    most 248: 4 consumer warps would get 256, past ptxas's 255)."""
    if not cfg.sm90:
        return {}
    return {"STAGES": cfg.num_stages, "maxnreg": min(sm90_maxnreg(cfg.num_warps), 248)}


def pick_conv(kernel, kernel_sm90, cfg: ConvConfig):
    """The kernel a config runs: the Gluon twin for sm90 configs. runtime.pick_kernel's rule, kept apart because
    sm90_compile.record_launches hooks pick_kernel to find the GEMM launches (whose twins take GEMM arguments)."""
    return kernel_sm90 if cfg.sm90 else kernel


# Tiles the tuner tries besides conv_config's: (rows, columns, K block, warps, stages). Measured on an H100 (the
# packed tile alone, benchmarks/conv/NOTES.md "The packed tile"): 128-row tiles at 4 warps won where a group has 64
# channels or fewer (level 2 problems 67 and 23: 28% and 21% under the default), the 8-warp 128 x 128 x 64 tile on a
# 64 -> 128 channel 3 x 3 conv (8%), the default on a Conv1d and a 1 x 1 conv. (8 warps: the flattened K loop
# Inductor miscompiled at 8 warps, pytorch#173068, is not this tile's; its 8-warp outputs matched the 4-warp ones.)
CONV_TUNE_TILES = ((128, 64, 32, 4, 3), (128, 128, 64, 8, 3), (128, 32, 32, 4, 3), (64, 64, 32, 4, 4),
                   (64, 128, 16, 4, 4), (32, 128, 32, 4, 4))


# The direct tile's (rows, warps) besides direct_config's, its columns the default's: the same accumulators over more
# or fewer threads, or half or twice the rows.
DIRECT_TUNE_TILES = ((128, 4), (256, 8), (64, 2), (512, 8))


def conv_candidates(geo: ConvGeometry, default: ConvConfig, scheme: str = "",
                    same_columns: bool = False) -> list[ConvConfig]:
    """The configs tuned_conv times: the default first, then CONV_TUNE_TILES clipped to the group's channels (no
    column tile wider than the default's) and to a tap's packed channels (k_block); the direct tile's
    DIRECT_TUNE_TILES. `same_columns`: only those as wide as the default."""
    if same_columns:
        return [c for c in conv_candidates(geo, default, scheme) if c.block_n == default.block_n]
    out = [default]
    if default.sm90:
        for tile in SM90_TUNE_TILES:
            cfg = _sm90_tile(geo, *tile)
            if cfg not in out:
                out.append(cfg)
        return out
    if scheme in DIRECT_SCHEMES:
        for m, warps in DIRECT_TUNE_TILES:
            cfg = ConvConfig(m, default.block_n, default.block_k, warps, 1)
            if cfg not in out:
                out.append(cfg)
        return out
    for m, n, k, warps, stages in CONV_TUNE_TILES:
        cfg = ConvConfig(m, min(n, default.block_n), k_block(geo, k), warps, stages)
        if cfg not in out:
            out.append(cfg)
    return out


def tuned_conv(kernel, geo: ConvGeometry, scheme: str, default: ConvConfig, x: torch.Tensor, launch,
               same_columns: bool = False) -> ConvConfig:
    """The tile config of one convolution launch: `default` (conv_config's) where nothing is tuned, else TUNER's
    pick among conv_candidates, timed on the first call at each geometry and kept in the disk cache.
    `launch(cfg)` must only write buffers it owns (tuning calls it several times). `same_columns`: only candidates
    as wide as the default (a kernel that needs every channel of a pixel in one column tile)."""
    if not x.is_cuda or SETTINGS.interpret or TUNER.mode == "off":
        return default
    key = (kernel, geo, scheme, x.dtype, x.device)
    cfg = _CONV_CONFIGS.get(key)
    if cfg is None:  # the GEMM tuner's timing and disk cache, under a key of the convolution's own
        disk_key = "|".join([torch.cuda.get_device_name(x.device), _kernel_name(kernel), _kernel_hash(kernel),
                             "conv:" + "x".join(map(str, geo.args())), str(x.dtype).replace("torch.", ""), scheme]
                            + (["sm90"] if default.sm90 else []))  # the twin's picks apart from the Triton tile's
        candidates = conv_candidates(geo, default, scheme, same_columns)
        cfg = TUNER._pick(disk_key, candidates, launch, lambda d: ConvConfig(**d))[0]
        _CONV_CONFIGS[key] = cfg
    return cfg


_CONV_CONFIGS: dict = {}  # (kernel, geometry, scheme, dtype, device) -> config: the per-call lookup


def conv_row_tiles(geo: ConvGeometry, cfg: ConvConfig) -> int:
    """The row tiles of a group (the pid_m range): of output pixels, or of wide rows for an sm90 config."""
    return cdiv(geo.wide_pixels if cfg.sm90 else geo.M, cfg.block_m)


def conv_grid(geo: ConvGeometry, cfg: ConvConfig) -> tuple[int, int]:
    """(row tiles x column tiles of a group, groups); an sm90 config's: its blocks, one per SM at most, walking the
    groups' tiles of wide rows (kernels/conv_sm90.py)."""
    if cfg.sm90:
        tiles = conv_row_tiles(geo, cfg) * cdiv(geo.COUT_G, cfg.block_n) * geo.groups
        return min(tiles, _num_sms(torch.device("cuda"))), 1
    return conv_row_tiles(geo, cfg) * cdiv(geo.COUT_G, cfg.block_n), geo.groups
