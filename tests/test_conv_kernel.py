"""kernels/conv.py under the Triton CPU interpreter at odd sizes, against torch's conv{1,2,3}d in float64.

The interpreter runs fp16 dots through numpy (exact fp16 products, fp32 sums), so the "fp16x3p" split's arithmetic
(per-sample and per-channel powers of two, hi/lo parts, three products) is exercised here as well as "ieee"."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from kfuse.kernels import conv as cv  # noqa: E402
from kfuse.kernels import conv_config as cc  # noqa: E402
from kfuse.kernels import conv_geometry as cg  # noqa: E402
from kfuse.kernels import conv_pack as pk  # noqa: E402

# (input shape, weight shape, stride, padding, dilation, groups): each straddles the tiles of TILES (several row and
# K blocks, a column tile wider than a group's channels), not the interpreter's default (few, large tiles)
TILES = cc.ConvConfig(32, 16, 16, 4, 1)
CASES = {
    "2d_strided_dilated": ((3, 5, 13, 11), (7, 5, 3, 2), 2, 1, 2, 1),
    "2d_depthwise": ((2, 4, 9, 7), (4, 1, 3, 3), 1, 1, 1, 4),
    "2d_grouped_tuples": ((3, 6, 11, 9), (9, 2, 3, 3), (2, 1), (2, 0), (1, 2), 3),
    "2d_batch1_valid": ((1, 3, 10, 9), (5, 3, 4, 2), 1, "valid", 1, 1),
    "1d_same_even_kernel": ((3, 5, 17), (7, 5, 4), 1, "same", 3, 1),
    "1d_strided": ((2, 3, 23), (6, 3, 5), 3, 2, 1, 1),
    "3d": ((2, 3, 5, 6, 7), (4, 3, 2, 3, 2), (1, 2, 1), (1, 0, 1), 1, 1),
    "3d_same_grouped": ((1, 4, 4, 5, 6), (6, 2, 3, 2, 3), 1, "same", (1, 2, 1), 2),
    # groups of 20 and 37 channels: packed to 32 and 48 (two and three 16-deep K blocks a tap, padding in the last)
    "2d_wide_groups": ((2, 40, 6, 5), (6, 20, 3, 2), 1, 1, 1, 2),
    "1d_37_channels": ((2, 37, 9), (5, 37, 3), 2, 1, 1, 1),
}


def _inputs(xs, ws, seed: int, scale: float = 1.0, bias: bool = True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*xs, generator=g) * scale
    fan_in = ws[1] * int(torch.tensor(ws[2:]).prod())
    w = (torch.rand(*ws, generator=g) * 2 - 1) / fan_in ** 0.5
    b = (torch.rand(ws[0], generator=g) * 2 - 1) / fan_in ** 0.5 if bias else None
    return x, w, b


def _check(scheme: str, xs, ws, stride, padding, dilation, groups, seed: int = 0, scale: float = 1.0,
           bias: bool = True) -> None:
    x, w, b = _inputs(xs, ws, seed, scale, bias)
    geo = (stride, padding, dilation, groups)
    ref = cv.conv_ref(x.double(), w.double(), None if b is None else b.double(), *geo)
    eager = cv.conv_ref(x, w, b, *geo)
    out = cv.conv_forward(x, w, b, *geo, scheme=scheme, cfg=TILES)
    assert out.shape == ref.shape and out.dtype == x.dtype
    assert torch.isfinite(out).all(), "unwritten or non-finite outputs"
    err = (out.double() - ref).abs().max().item()
    e_err = (eager.double() - ref).abs().max().item()
    scale_out = max(1.0, ref.abs().max().item())
    # the numpy interpreter sums in another order than torch: 2x eager's error plus a few fp32 ulps (as gemm_core's)
    assert err <= 2 * e_err + 4 * 2.0 ** -24 * scale_out, (err, e_err)
    assert torch.allclose(out, eager, atol=1e-4 * scale_out, rtol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
@pytest.mark.parametrize("scheme", ["ieee", "fp16x3p", "fp64"])
def test_conv_matches_float64(case, scheme):
    _check(scheme, *CASES[case])


@pytest.fixture
def dense(monkeypatch):
    """Dense K on (KFUSE_CONV_DENSE=1): groups of fewer than DENSE_BELOW channels packed as im2col rows."""
    monkeypatch.setattr(cg, "DENSE_ON", True)


DENSE_CASES = [c for c, (xs, ws, *_) in CASES.items() if ws[1] < cg.DENSE_BELOW]


@pytest.mark.parametrize("case", DENSE_CASES)
@pytest.mark.parametrize("scheme", ["ieee", "fp16x3p", "fp64"])
def test_dense_k_matches_float64(dense, case, scheme):
    """Dense K: im2col rows whose K blocks straddle taps (of 2, 3 or 5 channels), the zero padding at every edge
    (strided, dilated, 'same', grouped, 1-d to 3-d) and past taps * CIN_G written by the pack."""
    xs, ws, *geo = CASES[case]
    assert cv.conv_geometry(xs, ws, *geo).dense
    _check(scheme, *CASES[case])


def test_dense_k_problem_23_shape_in_several_blocks(dense):
    """KernelBench level 2 problem 23's convolution (3 -> 24 channels, 3 x 3 x 3) at a small size, in 32-deep blocks
    (81 columns padded to 96: the last block part padding) and in the interpreter's default tiles."""
    xs, ws = (2, 3, 5, 6, 7), (24, 3, 3, 3, 3)
    x, w, b = _inputs(xs, ws, 11)
    ref = cv.conv_ref(x.double(), w.double(), b.double())
    for cfg in (cc.ConvConfig(16, 16, 32, 4, 1), None):
        out = cv.conv_forward(x, w, b, scheme="fp16x3p", cfg=cfg)
        assert (out.double() - ref).abs().max().item() < 1e-6


def test_dense_layouts_and_k_blocks(dense):
    """Dense packing: an im2col row per output pixel and group, its (tap, channel) columns those of torch's unfold
    (zeros in the padding), then zeros to a multiple of DENSE_K_ALIGN; the weight's K in the same order, padded
    alike; K blocks of 32 (16 where the cap is)."""
    x = torch.randn(2, 6, 5, 7)
    geo = cv.conv_geometry(tuple(x.shape), (6, 2, 3, 3), 1, 1, 1, 3)  # 3 groups of 2 channels: K = 18 -> 32
    assert geo.dense and pk.dense_columns(geo.K) == 32
    packed, scale = pk.pack_im2col(x, geo, False)
    assert scale is None and packed.shape == (geo.M * 3 * 32,)
    rows = packed.view(2, 5 * 7, 3, 32)
    want = torch.nn.functional.unfold(x, 3, padding=1).view(2, 3, 2, 9, 35).permute(0, 4, 1, 3, 2).reshape(2, 35, 3, 18)
    assert torch.equal(rows[..., :18], want) and (rows[..., 18:] == 0).all()
    w = torch.randn(4, 3, 3, 3)
    wp = pk.packed_weight(w, dense=True)
    assert wp.shape == (4, 32) and (wp[:, 27:] == 0).all()
    assert torch.equal(wp[:, :27].view(4, 9, 3), w.view(4, 3, 9).transpose(1, 2))
    assert cc.k_block(geo, 64) == 32 and cc.k_block(geo, 16) == 16
    assert not cv.conv_geometry((2, 8, 9, 9), (8, 8, 3, 3), 1, 0, 1, 1).dense  # 8 channels stay padded


def test_dense_split_rows_are_the_packed_splits(dense):
    """On fp16x3p an im2col row is the hi parts of x * s[n] then the lo parts, as pack_input's records."""
    x = torch.randn(3, 3, 4, 6) * torch.tensor([1e-3, 1.0, 1e3]).view(3, 1, 1, 1)
    geo = cv.conv_geometry(tuple(x.shape), (5, 3, 1, 1), 1, 0, 1, 1)  # 1 x 1: a row is the pixel's channels
    rows, scale = pk.pack_im2col(x, geo, True)
    records, scale_p = pk.pack_input(x, 1, True)
    assert torch.equal(scale, scale_p)
    rows, records = rows.view(-1, 2, 32), records.view(-1, 2, 16)
    assert torch.equal(rows[..., :3], records[..., :3]) and (rows[..., 3:] == 0).all()


@pytest.mark.parametrize("case", ["2d_strided_dilated", "3d_same_grouped"])
def test_fp64_scheme_rounds_once(case):
    """The interpreter's scheme: fp32 dots over 16-deep K blocks, summed in float64, one rounding: each element
    within the error bound of a 16-term fp32 sum (16 ulps of sum |x w|) plus the final rounding."""
    xs, ws, *geo = CASES[case]
    x, w, b = _inputs(xs, ws, 7)
    ref = cv.conv_ref(x.double(), w.double(), b.double(), *geo)
    magnitude = cv.conv_ref(x.double().abs(), w.double().abs(), b.double().abs(), *geo)
    out = cv.conv_forward(x, w, b, *geo, scheme="fp64", cfg=TILES)
    assert ((out.double() - ref).abs() <= 2.0 ** -24 * (16 * magnitude + ref.abs())).all()


def test_conv_without_bias():
    _check("fp16x3p", *CASES["2d_strided_dilated"], bias=False)


@pytest.mark.parametrize("scale", [1e-6, 1e6, 1e-30])
def test_split_range(scale):
    """The per-sample powers of two keep the fp16 parts in range whatever the input's magnitude."""
    _check("fp16x3p", *CASES["1d_strided"], seed=3, scale=scale)


def test_samples_of_very_different_magnitude():
    """Each sample has its own power of two: a sample 1e8 times smaller than its neighbour keeps its accuracy."""
    x, w, b = _inputs((2, 3, 23), (6, 3, 5), 5)
    x[1] *= 1e-8
    out = cv.conv_forward(x, w, None, 3, 2, scheme="fp16x3p")
    ref = cv.conv_ref(x.double(), w.double(), None, 3, 2)
    rel = ((out[1].double() - ref[1]).abs().max() / ref[1].abs().max()).item()
    assert rel < 1e-6, rel


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_geometry_gives_torch_output_shape(case):
    xs, ws, stride, padding, dilation, groups = CASES[case]
    geo = cv.conv_geometry(xs, ws, stride, padding, dilation, groups)
    expected = cv.conv_ref(torch.zeros(xs), torch.zeros(ws), None, stride, padding, dilation, groups).shape
    assert geo.out_shape == tuple(expected)
    assert geo.M * geo.C_out == int(torch.tensor(expected).prod())
    assert len(geo.args()) == 23


@pytest.mark.parametrize("split", [False, True])
def test_packed_input_layout(split):
    """pack_input: pixel-major records of each group's channels padded to 16, on `split` the hi parts of x * s[n]
    then the lo parts, whose sum gives back x * s[n] to ~2^-22 relative; zeros in the padding."""
    x = torch.randn(3, 6, 5, 7)
    packed, scale = pk.pack_input(x, 2, split)
    rec = packed.view(3, 5, 7, 2, -1, 16)  # (n, h, w, group, hi/lo or one part, channels)
    want = x.view(3, 2, 3, 5, 7).permute(0, 3, 4, 1, 2)  # (n, h, w, group, channel)
    assert (rec[..., 3:] == 0).all()
    if split:
        assert rec.shape[4] == 2 and scale.shape == (3,)
        scaled = want.double() * scale.double().view(3, 1, 1, 1, 1)
        got = rec[:, :, :, :, 0, :3].double() + rec[:, :, :, :, 1, :3].double()
        assert ((got - scaled).abs() <= 2.0 ** -22 * scaled.abs().amax()).all()
    else:
        assert scale is None and torch.equal(rec[:, :, :, :, 0, :3], want)


@pytest.mark.parametrize("cin_g", [1, 3, 16, 20, 37, 64, 96, 200])
def test_k_blocks_divide_a_taps_channels(cin_g):
    """The tile has no K mask: every config conv_config and the tuner make has K blocks that divide a tap's packed
    channels, and as deep as they can be (up to the cap)."""
    geo = cv.conv_geometry((2, cin_g, 9, 9), (8, cin_g, 3, 3), 1, 0, 1, 1)
    cp = pk.packed_channels(cin_g)
    configs = [cc.conv_config(geo, s, i) for s in ("fp16x3p", "ieee", "fp64") for i in (False, True)]
    configs += cc.conv_candidates(geo, configs[0])
    assert all(cp % c.block_k == 0 and c.block_k >= 16 for c in configs)
    assert configs[0].block_k == min(32, cp & -cp) and cp % 16 == 0 and cp - cin_g < 16


def test_geometry_rejects_mismatched_groups():
    with pytest.raises(ValueError):
        cv.conv_geometry((1, 6, 8, 8), (4, 4, 3, 3), 1, 0, 1, 2)


def test_weight_split_is_cached_until_the_weight_changes():
    x, w, b = _inputs(*CASES["1d_strided"][:2], 1)
    w = torch.nn.Parameter(w)
    first = pk.cached_conv_weight(w, "fp16x3p")
    assert pk.cached_conv_weight(w, "fp16x3p") is first
    assert pk.cached_conv_weight(w, "ieee") is not first  # another scheme: the fp32 packed matrix
    before = cv.conv_forward(x, w, None, 3, 2, scheme="fp16x3p")
    with torch.no_grad():
        w.mul_(2.0)
    assert pk.cached_conv_weight(w, "fp16x3p") is not first
    after = cv.conv_forward(x, w, None, 3, 2, scheme="fp16x3p")
    torch.testing.assert_close(after, 2 * before, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", ["2d_grouped_tuples", "3d_same_grouped"])
def test_default_interpreter_tiles(case):
    """The interpreter's own config (few, large tiles: conv_config) gives the same answers as TILES."""
    x, w, b = _inputs(*CASES[case][:2], 2)
    geo = CASES[case][2:]
    default = cv.conv_forward(x, w, b, *geo, scheme="fp16x3p")
    tiled = cv.conv_forward(x, w, b, *geo, scheme="fp16x3p", cfg=TILES)
    torch.testing.assert_close(default, tiled, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(default, cv.conv_ref(x, w, b, *geo), rtol=1e-4, atol=1e-5)


# Compiled for sm_90 without a GPU (Triton's bundled ptxas), in a fresh process: the interpreter, which the tests
# above need, makes every jit function one the compiler cannot take. Proves the kernel lowers (dot shapes and types,
# layouts) and fits (no spill, shared memory); the results on tensor cores are a GPU test's to check.
COMPILE = r'''
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kfuse.sm90_compile import _ptxas_usage
path, name, scheme, bm, bn, bk, warps, stages, dense = json.loads(sys.argv[1])
if path.endswith(".py"):
    spec = importlib.util.spec_from_file_location("generated", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
else:
    module = importlib.import_module(path)
kernel = getattr(module, name)
values = {"HAS_BIAS": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SCHEME": scheme, "DENSE": dense}
signature, constexprs = {}, {}
halves = ("w_ptr", "w_lo_ptr", "x_ptr")  # fp16 on fp16x3p: the weight's parts and the packed input
for i, p in enumerate(kernel.params):
    if p.is_constexpr:
        signature[p.name] = "constexpr"
        constexprs[(i,)] = values[p.name]
    elif p.name == "phase_ptr":  # conv_transpose's per-phase integers
        signature[p.name] = "*i32"
    elif p.name.endswith("_ptr"):
        signature[p.name] = "*fp16" if scheme == "fp16x3p" and p.name in halves else "*fp32"
    else:
        signature[p.name] = "fp32" if p.name.startswith("s_") else "i32"
# as Triton specializes them at a launch: torch's buffers are 16-byte aligned, a split weight's row stride is a
# multiple of 64 (without the hints no load is pipelined and the register counts are not the GPU's)
attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(kernel.params)
         if p.name.endswith("_ptr") or p.name == "stride_wn"}
built = triton.compile(ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
regs, spill = _ptxas_usage(built.asm["ptx"])
print(json.dumps({"shared": built.metadata.shared, "registers": regs, "spill": spill}))
'''


def compile_sm90(path: str, name: str, scheme: str, cfg: cc.ConvConfig, dense: bool = False) -> dict:
    import json
    import subprocess
    import sys
    args = [path, name, scheme, cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages, dense]
    out = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(args)], capture_output=True, text=True,
                         env=dict(os.environ, TRITON_INTERPRET="0"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


# the GPU's default tile for a wide group (KernelBench level 2 problem 1's 128 channels) and for a depthwise one
GPU_GEOMETRIES = {"wide": cv.conv_geometry((128, 64, 128, 128), (128, 64, 3, 3), 1, 0, 1, 1),
                  "depthwise": cv.conv_geometry((16, 32, 56, 56), (32, 1, 3, 3), 1, 1, 1, 32)}


@pytest.mark.parametrize("geo,scheme", [("wide", "fp16x3p"), ("depthwise", "fp16x3p"), ("depthwise", "tf32x3")])
def test_compiles_for_sm90(geo, scheme):
    """The default scheme's tiles fit without spilling. (tf32x3 at the wide 64 x 128 x 32 tile spills 20 bytes:
    a speed matter for a scheme no default picks.)"""
    cfg = cc.conv_config(GPU_GEOMETRIES[geo], scheme, interpret=False)
    build = compile_sm90("kfuse.kernels.conv", "conv_bias_kernel", scheme, cfg)
    assert build["spill"] == 0 and build["shared"] <= 232448, build


def test_dense_k_compiles_for_sm90(dense):
    """The dense tile at KernelBench level 2 problem 23's geometry (3 -> 24 channels, 3 x 3 x 3): the default tile
    and the tuner's 128-row ones lower and fit without a spill."""
    geo = cv.conv_geometry((128, 3, 24, 32, 32), (24, 3, 3, 3, 3), 1, 0, 1, 1)
    default = cc.conv_config(geo, "fp16x3p", interpret=False)
    candidates = cc.conv_candidates(geo, default)
    assert default.block_k == 32
    assert cc.ConvConfig(128, 32, 32, 8, 3) in candidates and cc.ConvConfig(128, 32, 32, 4, 3) in candidates
    for cfg in (default, cc.ConvConfig(128, 32, 32, 8, 3), cc.ConvConfig(128, 32, 32, 4, 3)):
        build = compile_sm90("kfuse.kernels.conv", "conv_bias_kernel", "fp16x3p", cfg, dense=True)
        assert build["spill"] == 0 and build["shared"] <= 232448, (cfg, build)


def test_generated_region_compiles_for_sm90(tmp_path):
    """A conv_epilogue kernel of a generated file (problems/conv/02: (C,1,1) bias and a scalar after the conv)."""
    from kfuse.load import load_problem
    from kfuse.optimize import Options, compile_problem
    from kfuse_testing import ROOT
    prob = load_problem(ROOT / "problems" / "conv" / "02_conv2d_bias_scale.py",
                        {"batch_size": 2, "height": 7, "width": 6})
    path = tmp_path / "generated.py"
    path.write_text(compile_problem(prob, Options(device="cpu")).source)
    cfg = cc.conv_config(GPU_GEOMETRIES["wide"], "fp16x3p", interpret=False)
    build = compile_sm90(str(path), "conv_add_mul_kernel", "fp16x3p", cfg)
    assert build["spill"] == 0, build


def test_tuned_conv_candidates_and_untuned_paths():
    """conv_candidates: the default first, no repeats, no column tile wider than the default's, K blocks that
    divide a tap's packed channels; on the CPU (and in the interpreter) tuned_conv returns the default untimed."""
    kc = cv
    geo = kc.conv_geometry((2, 3, 9, 11), (5, 3, 3, 3), 1, 1, 1, 1)  # K = 27, 5 channels
    default = cc.conv_config(geo, "fp16x3p", interpret=False)
    cands = cc.conv_candidates(geo, default)
    assert cands[0] == default and len(set(cands)) == len(cands) > 1
    assert all(c.block_n <= default.block_n and c.block_k == 16 and c.num_warps in (4, 8) for c in cands)
    assert all(c.block_m * c.block_n <= 128 * 128 for c in cands)
    wide = kc.conv_geometry((2, 64, 9, 11), (128, 64, 3, 3), 1, 1, 1, 1)  # a 128-wide default: narrower candidates
    wide_default = cc.conv_config(wide, "fp16x3p", interpret=False)
    same = cc.conv_candidates(wide, wide_default, "fp16x3p", same_columns=True)
    assert same[0] == wide_default and 1 < len(same) < len(cc.conv_candidates(wide, wide_default, "fp16x3p"))
    assert all(c.block_n == wide_default.block_n == 128 for c in same)
    calls = []
    x = torch.randn(2, 3, 9, 11)
    assert cc.tuned_conv("k", geo, "fp16x3p", default, x, calls.append) == default and calls == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the compiled tile: a GPU, TRITON_INTERPRET=0")
@pytest.mark.parametrize("case", DENSE_CASES)
def test_dense_k_on_the_gpu(dense, case):
    """Dense K compiled, on the tensor cores (fp16x3p): within 2x the error of a strict fp32 convolution (cuDNN,
    TF32 off) plus a few ulps, against float64, at every odd geometry of CASES and at problem 23's full shape."""
    torch.backends.cudnn.allow_tf32 = False
    shapes = [CASES[case], ((128, 3, 24, 32, 32), (24, 3, 3, 3, 3), 1, 0, 1, 1)]
    for xs, ws, *geo in shapes[:1] if case != DENSE_CASES[0] else shapes:
        x, w, b = (t.cuda() for t in _inputs(xs, ws, 5))
        ref = cv.conv_ref(x.double(), w.double(), b.double(), *geo)
        strict = (cv.conv_ref(x, w, b, *geo).double() - ref).abs().max().item()
        out = cv.conv_forward(x, w, b, *geo)
        err = (out.double() - ref).abs().max().item()
        assert err <= 2 * strict + 4 * 2.0 ** -24 * max(1.0, ref.abs().max().item()), (xs, err, strict)
