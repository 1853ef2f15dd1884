"""kernels/conv_sm90.py: the convolution tile in Gluon on wide rows (stride-1 convolutions on a Hopper GPU).

Without a GPU: the padded pack the tile reads (pack_input with `pad`) is the plain pack of the zero-padded input;
wide_rows maps the padded grid back to output pixels; the configs, the grid and the choice of the tile; the kernel
compiles for sm_90 (Triton's bundled ptxas) without spilling, in an H100's shared memory. On a Hopper GPU (marked
gpu): conv_forward on the Gluon tile, at odd sizes (rows past the last tile, groups, channels past a column tile,
dilation, 'same' padding with an even kernel, 1-d and 3-d), is within 2x a strict fp32 convolution's error against
float64 and agrees with the Triton tile.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kfuse.kernels import conv as cv  # noqa: E402
from kfuse.kernels import conv_config as cc  # noqa: E402
from kfuse.kernels import conv_pack as pk  # noqa: E402
from kfuse.kernels import runtime  # noqa: E402
from kfuse.kernels.conv_geometry import conv_geometry  # noqa: E402
from kfuse.sm90_compile import SM90_LIMIT_SMEM  # noqa: E402

# (input shape, weight shape, stride, padding, dilation, groups): stride 1 throughout (the wide rows' condition)
CASES = {
    "2d_odd_dilated": ((3, 20, 37, 70), (37, 20, 3, 2), 1, (1, 0), (2, 1), 1),
    "2d_grouped": ((2, 64, 19, 23), (96, 32, 3, 3), 1, 1, 1, 2),
    "2d_17_channels": ((3, 17, 31, 33), (64, 17, 3, 3), 1, 0, 1, 1),
    "1d_same_even_kernel": ((4, 24, 129), (33, 24, 4), 1, "same", 1, 1),
    "3d_padded": ((2, 32, 9, 11, 13), (24, 32, 3, 3, 3), 1, 1, 1, 1),
    "2d_batch1_wide": ((1, 64, 17, 300), (130, 64, 3, 3), 1, 0, 1, 1),
}


def _inputs(xs, ws, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*xs, generator=g)
    fan_in = ws[1] * int(torch.tensor(ws[2:]).prod())
    w = (torch.rand(*ws, generator=g) * 2 - 1) / fan_in ** 0.5
    b = (torch.rand(ws[0], generator=g) * 2 - 1) / fan_in ** 0.5
    return x, w, b


@pytest.mark.parametrize("split", [False, True])
def test_padded_pack_is_the_pack_of_the_padded_input(split):
    """pack_input with `pad` lays the pixels on the padded grid at the leading padding, zero records around them:
    bit for bit the plain pack of the zero-padded input (the same per-sample scales: zeros add no magnitude)."""
    x = torch.randn(2, 6, 5, 7, device="cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda")
    padded, scale = pk.pack_input(x, 2, split, ((0, 1, 2), (1, 8, 10)))
    want, want_scale = pk.pack_input(torch.nn.functional.pad(x, (2, 1, 1, 2)), 2, split)
    assert torch.equal(padded, want)
    assert (scale is None and want_scale is None) or torch.equal(scale, want_scale)


def test_wide_grid_and_rows():
    """The wide grid of a stride-1 convolution is its padded input (output + dilation * (kernel - 1) per dim), and
    wide_rows (its Python twin here) maps each grid pixel inside the output's box to the output pixel, once."""
    geo = conv_geometry((3, 4, 9, 11), (5, 4, 3, 2), 1, (1, 0), (2, 1), 1)
    (lead, grid) = geo.wide_pad()
    assert lead == (0, 1, 0) and grid == (1, geo.OH + 4, geo.OW + 1)
    assert geo.wide_pixels == 3 * grid[0] * grid[1] * grid[2]
    seen = []
    for p in range(geo.wide_pixels):
        w, t = p % grid[2], p // grid[2]
        h, n = t % grid[1], t // grid[1] // grid[0]
        if h < geo.OH and w < geo.OW:
            seen.append((n * geo.OH + h) * geo.OW + w)
    assert seen == list(range(geo.M))


def test_sm90_configs_and_choice(monkeypatch):
    """The Gluon tile's configs: 128 rows over 8 warps (64 over 4), K blocks dividing a tap's channels, stages that
    fit the shared memory; the tuner times only its own configs against it (the operands differ); the grid is a
    block per SM at most, walking the tiles of wide rows. The tile is chosen only for fp16x3p at stride 1, groups of
    more than 16 channels, on a Hopper GPU (never here, without one)."""
    geo = conv_geometry((2, 20, 37, 70), (37, 20, 3, 2), 1, 0, 1, 1)
    cfg = cc.sm90_config(geo)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.sm90) == (128, 64, 32, 8, True)
    assert 2 * 2 * (cfg.block_m + cfg.block_n) * cfg.block_k * cfg.num_stages <= cc.SM90_SMEM
    cands = cc.conv_candidates(geo, cfg, "fp16x3p")
    assert cands[0] == cfg and all(c.sm90 and 32 % c.block_k == 0 for c in cands) and len(cands) > 1
    monkeypatch.setattr(cc, "_num_sms", lambda device: 132)
    assert cc.conv_grid(geo, cfg) == (min(-(-geo.wide_pixels // 128), 132), 1)  # persistent: a block per SM at most
    assert cc.conv_options(cfg) == {"STAGES": cfg.num_stages, "maxnreg": 168}
    assert not cv.wide_ok(torch.empty(0), geo, "fp16x3p")  # a CPU tensor
    monkeypatch.setattr(cv, "sm90_ok", lambda t: True)
    assert cv.wide_ok(torch.empty(0), geo, "fp16x3p") and not cv.wide_ok(torch.empty(0), geo, "ieee")
    strided = conv_geometry((2, 20, 37, 70), (37, 20, 3, 2), 2, 0, 1, 1)
    narrow = conv_geometry((2, 16, 37, 70), (37, 16, 3, 2), 1, 0, 1, 1)  # 16 channels: 16-deep K blocks
    assert not cv.wide_ok(torch.empty(0), strided, "fp16x3p") and not cv.wide_ok(torch.empty(0), narrow, "fp16x3p")
    monkeypatch.setattr(cv, "SM90_ON", False)
    assert not cv.wide_ok(torch.empty(0), geo, "fp16x3p")


def test_conv_forward_refuses_a_config_for_the_other_operands():
    """conv_forward's cfg must match the plan's operands: an sm90 config where the plan packed for the Triton tile
    (here, without a GPU) is one clear error, not a launch on the wrong layout."""
    x, w, b = _inputs((2, 20, 9, 11), (24, 20, 3, 3), 0)
    geo = conv_geometry(tuple(x.shape), tuple(w.shape), 1, 0, 1, 1)
    with pytest.raises(ValueError, match="for packed operands"):
        cv.conv_forward(x, w, b, cfg=cc.sm90_config(geo))


COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from kfuse.kernels import conv as cv
from kfuse.kernels import conv_config as cc
from kfuse.sm90_compile import _ptxas_usage
bm, bn, bk, warps, stages = json.loads(sys.argv[1])
k = cv.conv_bias_kernel_sm90
cfg = cc.ConvConfig(bm, bn, bk, warps, stages, sm90=True)
values = {"HAS_BIAS": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SCHEME": "fp16x3p", "DENSE": False,
          "STAGES": stages, "CHUNK": 4}
signature, constexprs = {}, {}
for i, p in enumerate(k.params):
    if p.is_constexpr:
        signature[p.name] = "constexpr"
        constexprs[(i,)] = values[p.name]
    else:
        signature[p.name] = "*fp16" if p.name in ("x_ptr", "w_ptr", "w_lo_ptr") else (
            "*fp32" if p.name.endswith("_ptr") else "i32")
kernel = triton.compile(GluonASTSource(k, signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": warps, "maxnreg": cc.conv_options(cfg)["maxnreg"]})
regs, spill = _ptxas_usage(kernel.asm["ptx"])
print(json.dumps({"shared": kernel.metadata.shared, "regs": regs, "spill": spill}))
"""


@pytest.mark.skipif(not runtime.HAVE_GLUON, reason="Triton without Gluon")
@pytest.mark.parametrize("tile", [(128, 128, 64, 8, 3), (64, 128, 64, 4, 3), (128, 16, 16, 8, 4)])
def test_tile_compiles_for_sm90(tile):
    """conv_bias_kernel_sm90 lowers for sm_90a at the default tile, a 4-warp one and the narrowest, in the shared
    memory an H100 / H200 block may have. At 128 columns the epilogue, run on the accumulator's layout inside the
    consumer partition, spills 108 bytes (ptxas, Triton 3.6): bounded here so that it does not grow unnoticed."""
    out = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(tile)], capture_output=True, text=True,
                         env=dict(os.environ, TRITON_INTERPRET="0"), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    build = json.loads(out.stdout.splitlines()[-1])
    assert build["spill"] <= (128 if tile[1] == 128 else 0) and build["shared"] <= SM90_LIMIT_SMEM, build


GENERATED = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from kfuse.kernels import conv_config as cc
from kfuse.optimize import load_module
from kfuse.sm90_compile import _ptxas_usage
path, tile = sys.argv[1], json.loads(sys.argv[2])
module = load_module(path)
builds = []
for name in sorted(n for n in dir(module) if n.endswith("_kernel_sm90")):
    k = getattr(module, name)
    cfg = cc.ConvConfig(*tile, sm90=True)
    values = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "SCHEME": "fp16x3p",
              "DENSE": False, "STAGES": cfg.num_stages, "CHUNK": 4}
    signature, constexprs = {}, {}
    for i, p in enumerate(k.params):
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[(i,)] = values.get(p.name, p._param.default)
        else:
            signature[p.name] = "*fp16" if p.name in ("x_ptr", "w_ptr", "w_lo_ptr") else (
                "*fp32" if p.name.endswith("_ptr") else "i32")
    kernel = triton.compile(GluonASTSource(k, signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": cfg.num_warps, "maxnreg": cc.conv_options(cfg)["maxnreg"]})
    regs, spill = _ptxas_usage(kernel.asm["ptx"])
    builds.append({"twin": name, "shared": kernel.metadata.shared, "spill": spill})
print(json.dumps(builds))
"""


@pytest.mark.skipif(not runtime.HAVE_GLUON, reason="Triton without Gluon")
@pytest.mark.parametrize("problem, twins", [("kb_level2_1", 1), ("51_conv2d_layernorm_hw_gelu_residual", 1)])
def test_generated_twins_compile_for_sm90(tmp_path, problem, twins):
    """A conv_epilogue region's kernel (KernelBench level 2 problem 1's ops, written here) and a LayerNorm region's
    convolution pass come with a Hopper twin, their launchers plan with sm90=True, and the twins lower for sm_90a
    at 128 x 64 x 64 (8 warps, 4 stages) without spilling."""
    from kfuse.load import load_problem
    from kfuse.optimize import Options, compile_problem
    from kfuse_testing import ROOT

    path = ROOT / "problems" / "conv" / f"{problem}.py"
    if problem.startswith("kb_"):
        path = tmp_path / "p1.py"
        path.write_text(KB_LEVEL2_1)
    src = compile_problem(load_problem(path, {}), Options(device="cpu")).source
    out_path = tmp_path / "new.py"
    out_path.write_text(src)
    assert len(re.findall(r"^def \w+_kernel_sm90\(", src, re.M)) == twins and "sm90=True)" in src
    out = subprocess.run([sys.executable, "-c", GENERATED, str(out_path), json.dumps([128, 64, 64, 8, 4])],
                         capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="0"), timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    builds = json.loads(out.stdout.splitlines()[-1])
    assert len(builds) == twins and all(b["spill"] == 0 and b["shared"] <= SM90_LIMIT_SMEM for b in builds), builds


KB_LEVEL2_1 = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return torch.relu(self.conv(x)) + self.bias


batch_size, in_channels, out_channels, height, width, kernel_size = 2, 20, 24, 9, 11, 3


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, (out_channels, 1, 1)]
"""


def _on_hopper() -> bool:
    return (torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
            and runtime.sm90_ok(torch.empty(0, device="cuda")))


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs a Hopper GPU (sm_90), Gluon and TRITON_INTERPRET=0")
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_gluon_tile_meets_the_contract(case, monkeypatch):
    """On the Gluon tile (every candidate config): within 2x a strict fp32 convolution's error against float64 plus
    a few ulps, and within 1e-4 of the Triton tile's output."""
    xs, ws, *geo = CASES[case]
    x, w, b = (t.cuda() for t in _inputs(xs, ws, 3))
    torch.backends.cudnn.allow_tf32 = False
    ref = cv.conv_ref(x.double(), w.double(), b.double(), *geo)
    strict = (cv.conv_ref(x, w, b, *geo).double() - ref).abs().max().item()
    bound = 2 * strict + 4 * 2.0 ** -24 * max(1.0, ref.abs().max().item())
    g = conv_geometry(tuple(x.shape), tuple(w.shape), *geo)
    assert cv.conv_plan(x, w, *geo, sm90=True)[2].sm90, "the Gluon tile was not chosen"
    for cfg in cc.conv_candidates(g, cc.sm90_config(g), "fp16x3p"):
        out = cv.conv_forward(x, w, b, *geo, cfg=cfg)
        err = (out.double() - ref).abs().max().item()
        assert err <= bound, (cfg.short(), err, strict)
    monkeypatch.setattr(cv, "SM90_ON", False)
    triton_tile = cv.conv_forward(x, w, b, *geo)
    assert torch.allclose(out, triton_tile, atol=1e-4, rtol=1e-4)
