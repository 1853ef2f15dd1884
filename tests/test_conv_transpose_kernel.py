"""kernels/conv_transpose.py under the Triton CPU interpreter at odd sizes, against torch's conv_transpose{1,2,3}d
in float64: strides 2 and 3 with output_padding, dilation (coprime with the stride and not), groups, batch 1,
strides larger than the dilated kernel (phases with no tap), padding wider than the kernel, no bias."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from kfuse.kernels import conv as cv  # noqa: E402
from kfuse.kernels import conv_config as cc  # noqa: E402
from kfuse.kernels import conv_geometry as cg  # noqa: E402
from kfuse.kernels import conv_transpose as ct  # noqa: E402

# (input shape, weight shape (C_in, C_out/groups, k...), stride, padding, output_padding, groups, dilation); TILES
# straddles them (several row and K blocks, a column tile wider than a group's channels)
TILES = cc.ConvConfig(16, 16, 16, 4, 1)
CASES = {
    "1d_s3_op2_dil2": ((2, 5, 9), (5, 3, 4), 3, 2, 2, 1, 2),
    "1d_batch1_stride_over_kernel": ((1, 4, 7), (4, 3, 2), 3, 0, 1, 1, 1),
    "2d_s2_op1_grouped": ((2, 6, 5, 7), (6, 2, 3, 3), 2, 1, 1, 3, 1),
    "2d_asym_dilated": ((3, 4, 5, 4), (4, 3, 3, 2), (2, 3), (1, 2), (1, 0), 1, (2, 1)),
    "2d_dil_multiple_of_stride": ((2, 3, 4, 5), (3, 4, 3, 3), 2, 1, 1, 1, 2),
    "2d_batch1_pad_over_kernel": ((1, 3, 7, 6), (3, 5, 2, 3), 1, (2, 3), 0, 1, 1),
    "3d_s212_op_grouped": ((1, 4, 3, 4, 3), (4, 3, 2, 3, 2), (2, 1, 2), (0, 1, 1), (1, 0, 1), 2, 1),
    "3d_s3_dilated": ((2, 3, 2, 3, 2), (3, 2, 3, 2, 2), 3, 1, 2, 1, (1, 2, 2)),
}


def _inputs(xs, ws, groups: int, seed: int, scale: float = 1.0, bias: bool = True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*xs, generator=g) * scale
    fan_in = ws[1] * int(torch.tensor(ws[2:]).prod())
    w = (torch.rand(*ws, generator=g) * 2 - 1) / fan_in ** 0.5
    b = (torch.rand(ws[1] * groups, generator=g) * 2 - 1) / fan_in ** 0.5 if bias else None
    return x, w, b


def _geo(case: str) -> tuple:
    return CASES[case][2:]


def _check(scheme: str, case: str, seed: int = 0, scale: float = 1.0, bias: bool = True, cfg=TILES) -> None:
    xs, ws, *geo = CASES[case]
    x, w, b = _inputs(xs, ws, geo[3], seed, scale, bias)
    ref = ct.conv_transpose_ref(x.double(), w.double(), None if b is None else b.double(), *geo)
    eager = ct.conv_transpose_ref(x, w, b, *geo)
    out = ct.conv_transpose_forward(x, w, b, *geo, scheme=scheme, cfg=cfg)
    assert out.shape == ref.shape and out.dtype == x.dtype
    assert torch.isfinite(out).all(), "unwritten or non-finite outputs"
    err = (out.double() - ref).abs().max().item()
    e_err = (eager.double() - ref).abs().max().item()
    scale_out = max(1.0, ref.abs().max().item())
    # the numpy interpreter sums in another order than torch: 2x eager's error plus a few fp32 ulps (as conv's)
    assert err <= 2 * e_err + 4 * 2.0 ** -24 * scale_out, (err, e_err)
    assert torch.allclose(out, eager, atol=1e-4 * scale_out, rtol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
@pytest.mark.parametrize("scheme", ["ieee", "fp16x3p", "fp64"])
def test_conv_transpose_matches_float64(case, scheme):
    _check(scheme, case)


def test_without_bias():
    _check("fp16x3p", "2d_s2_op1_grouped", bias=False)


@pytest.mark.parametrize("scale", [1e-6, 1e6, 1e-30])
def test_split_range(scale):
    """conv.py's per-sample powers of two keep the fp16 parts in range whatever the input's magnitude."""
    _check("fp16x3p", "1d_s3_op2_dil2", seed=3, scale=scale)


@pytest.mark.parametrize("case", ["2d_asym_dilated", "3d_s212_op_grouped"])
def test_default_interpreter_tiles(case):
    """The interpreter's own config (few, large tiles) gives the same answers as TILES."""
    xs, ws, *geo = CASES[case]
    x, w, b = _inputs(xs, ws, geo[3], 2)
    default = ct.conv_transpose_forward(x, w, b, *geo, scheme="fp64")
    tiled = ct.conv_transpose_forward(x, w, b, *geo, scheme="fp64", cfg=TILES)
    torch.testing.assert_close(default, tiled, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(default, ct.conv_transpose_ref(x, w, b, *geo), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_geometry_gives_torch_output_shape(case):
    xs, ws, *geo = CASES[case]
    g = ct.conv_transpose_geometry(xs, ws, *geo)
    expected = ct.conv_transpose_ref(torch.zeros(xs), torch.zeros(ws), None, *geo).shape
    assert g.out_shape == tuple(expected)
    assert len(g.args()) == 17


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_phases_partition_the_taps(case):
    """No product with an inserted zero: every kernel tap belongs to exactly one phase, so the phase-ordered weight
    holds each weight element once (its K columns: the kernel volume's taps of CP packed channels), and the tap
    lists agree with the divisibility rule of the gather form."""
    xs, ws, stride, padding, output_padding, groups, dilation = CASES[case]
    g = ct.conv_transpose_geometry(xs, ws, stride, padding, output_padding, groups, dilation)
    for ph, s, p, d, k in zip(g.phases, (g.SD, g.SH, g.SW), _pads(g, padding), _dils(g, dilation), g.kernel):
        for r in range(s):
            taps = [ph.k0[r] + j * ph.step for j in range(ph.nt[r])]
            assert taps == [kk for kk in range(k) if (r + p - kk * d) % s == 0]
        assert sum(ph.nt) == k
    w = torch.randn(ws)
    cp = cv.packed_channels(g.CIN_G)
    pw = ct.phase_weight(w, g, cp)  # each tap's channels padded to CP: zeros past CIN_G, the elements once each
    assert pw.shape == (g.C_out, cp * g.kernel[0] * g.kernel[1] * g.kernel[2])
    blocks = pw.view(g.C_out, -1, cp)
    assert (blocks[..., g.CIN_G:] == 0).all()
    assert torch.equal(blocks[..., :g.CIN_G].flatten().sort().values, w.flatten().sort().values)


def _pads(g, padding) -> tuple[int, int, int]:
    return cg._triple(padding, len(g.out_shape) - 2, 0, "padding")


def _dils(g, dilation) -> tuple[int, int, int]:
    return cg._triple(dilation, len(g.out_shape) - 2, 1, "dilation")


def test_geometry_rejects_bad_arguments():
    with pytest.raises(ValueError):  # output_padding must be below stride or dilation
        ct.conv_transpose_geometry((1, 4, 5, 5), (4, 2, 3, 3), 2, 0, 2, 1, 1)
    with pytest.raises(ValueError):  # channels not divisible by groups
        ct.conv_transpose_geometry((1, 4, 5, 5), (4, 2, 3, 3), 1, 0, 0, 3, 1)


def test_phase_weight_is_cached_until_the_weight_changes():
    xs, ws, *geo = CASES["1d_s3_op2_dil2"]
    x, w, _ = _inputs(xs, ws, 1, 1)
    w = torch.nn.Parameter(w)
    before = ct.conv_transpose_forward(x, w, None, *geo, scheme="fp16x3p")
    first = w._kfuse_conv_transpose
    ct.conv_transpose_forward(x, w, None, *geo, scheme="fp16x3p")
    assert w._kfuse_conv_transpose is first
    with torch.no_grad():
        w.mul_(2.0)
    after = ct.conv_transpose_forward(x, w, None, *geo, scheme="fp16x3p")
    assert w._kfuse_conv_transpose is not first
    torch.testing.assert_close(after, 2 * before, rtol=1e-6, atol=1e-6)
    other = ct.conv_transpose_forward(x, w, None, 2, 1, 1, 1, 1, scheme="fp16x3p")  # new geometry: new taps
    torch.testing.assert_close(other, ct.conv_transpose_ref(x, w.detach(), None, 2, 1, 1, 1, 1), rtol=1e-4, atol=1e-5)


# Compiled for sm_90 without a GPU (test_conv_kernel.compile_sm90: Triton's bundled ptxas, a fresh process), at the
# GPU's default tiles: 64 channels (KernelBench level 2 problem 2) and 128 (level 2 problem 91: a 128-wide tile)
GPU_GEOMETRIES = {"64ch": ct.conv_transpose_geometry((128, 64, 128, 128), (64, 64, 3, 3), 2, 1, 1, 1, 1),
                  "128ch": ct.conv_transpose_geometry((128, 64, 64, 64), (64, 128, 4, 4), 2, 1, 1, 1, 1)}


@pytest.mark.parametrize("geo,scheme", [("64ch", "fp16x3p"), ("128ch", "fp16x3p"), ("128ch", "tf32x3")])
def test_compiles_for_sm90(geo, scheme):
    """No spill at the default tiles (64 x 128 x 32 spilled 112 bytes: conv_transpose_config)."""
    from test_conv_kernel import compile_sm90
    cfg = ct.conv_transpose_config(GPU_GEOMETRIES[geo], scheme, interpret=False)
    build = compile_sm90("kfuse.kernels.conv_transpose", "conv_transpose_bias_kernel", scheme, cfg)
    assert build["spill"] == 0 and build["shared"] <= 232448, build


def test_generated_region_compiles_for_sm90(tmp_path):
    """A transposed conv_epilogue kernel of a generated file (problems/conv/19: ConvTranspose2d + ReLU)."""
    from kfuse.load import load_problem
    from kfuse.optimize import Options, compile_problem
    from kfuse_testing import ROOT
    from test_conv_kernel import compile_sm90
    prob = load_problem(ROOT / "problems" / "conv" / "19_conv_transpose2d_output_padding_relu.py",
                        {"batch_size": 2, "height": 5, "width": 4})
    path = tmp_path / "generated.py"
    path.write_text(compile_problem(prob, Options(device="cpu")).source)
    cfg = ct.conv_transpose_config(GPU_GEOMETRIES["128ch"], "fp16x3p", interpret=False)
    build = compile_sm90(str(path), "conv_transpose_relu_kernel", "fp16x3p", cfg)
    assert build["spill"] == 0, build


def test_transposed_region_tunes_its_tile():
    """A transposed conv_epilogue region's launch goes through tuned_conv (regions/conv_common.conv_launcher), whose
    candidates on a transposed geometry start with conv_transpose_config's default and hold 128 x 64 x 32 (the tile
    that won most often on an H200: benchmarks/conv/NOTES.md)."""
    from kfuse.load import load_problem
    from kfuse.optimize import Options, compile_problem
    from kfuse_testing import ROOT
    for geo in GPU_GEOMETRIES.values():
        default = ct.conv_transpose_config(geo, "fp16x3p", interpret=False)
        candidates = cc.conv_candidates(geo, default, "fp16x3p")
        assert candidates[0] == default and len(set(candidates)) == len(candidates)
        assert cc.ConvConfig(128, 64, 32, 4, 3) in candidates
    prob = load_problem(ROOT / "problems" / "conv" / "19_conv_transpose2d_output_padding_relu.py",
                        {"batch_size": 2, "height": 5, "width": 4})
    source = compile_problem(prob, Options(device="cpu")).source
    assert "launch(tuned_conv(conv_transpose_relu_kernel, geo, scheme, cfg, x, launch))" in source
