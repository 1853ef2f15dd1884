"""kernels/conv_direct.py (the direct tile for narrow groups) under the Triton CPU interpreter at odd sizes,
against torch's conv{1,2,3}d in float64, and which convolutions take it (conv_geometry.direct_k, conv.conv_plan)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from kfuse.kernels import conv as cv  # noqa: E402
from kfuse.kernels import conv_config as cc  # noqa: E402
from kfuse.kernels import conv_geometry as cg  # noqa: E402
from kfuse.kernels import pooling as pl  # noqa: E402
from test_conv_kernel import CASES, _check, _inputs, compile_sm90  # noqa: E402

# every geometry of test_conv_kernel the direct tile takes, and a few of its own: 1 to 7 channels, a
# column tile wider than the group's channels, rows straddling samples, stride, dilation, 'same', groups
DIRECT_CASES = {**{c: CASES[c] for c, (xs, ws, *_, groups) in CASES.items() if cg.direct_k(ws[1], ws[0] // groups)},
                "2d_7_channels_odd": ((3, 7, 37, 11), (5, 7, 3, 3), 1, 1, 1, 1),
                "2d_1_channel_strided": ((2, 1, 19, 23), (9, 1, 5, 3), (2, 3), (2, 1), 1, 1),
                "3d_grouped_dilated": ((2, 6, 7, 6, 5), (4, 3, 2, 3, 3), 1, (1, 2, 0), (2, 1, 2), 2),
                "1d_same_strided_5ch": ((3, 5, 29), (33, 5, 4), 1, "same", 2, 1)}


@pytest.mark.parametrize("case", DIRECT_CASES, ids=list(DIRECT_CASES))
@pytest.mark.parametrize("scheme", cc.DIRECT_SCHEMES)
def test_direct_matches_float64(case, scheme):
    _check(scheme, *DIRECT_CASES[case])


def test_direct_without_bias_and_at_large_values():
    xs, ws, *geo = DIRECT_CASES["2d_7_channels_odd"]
    _check("direct64", xs, ws, *geo, seed=3, scale=1e4, bias=False)


def test_direct64_is_the_float64_result_rounded_once():
    """Exact products summed in float64: the output is the float64 convolution rounded to fp32, bit for bit wherever
    the sum's own float64 rounding does not straddle an fp32 tie (at these sizes: everywhere)."""
    xs, ws, *geo = DIRECT_CASES["3d_grouped_dilated"]
    x, w, b = _inputs(xs, ws, 11, bias=False)
    out = cv.conv_forward(x, w, None, *geo, scheme="direct64", cfg=cc.ConvConfig(16, 4, 16, 4, 1))
    assert torch.equal(out, cv.conv_ref(x.double(), w.double(), None, *geo).float())


def test_plan_picks_the_direct_tile_for_few_channels(monkeypatch):
    x = torch.randn(2, 3, 9, 8)
    geo, scheme, cfg, ops, _ = cv.conv_plan(x, torch.randn(5, 3, 3, 3), 1, 0, 1, 1)
    assert geo.direct and scheme == "direct64" and ops[0] is x  # x as it is: no pack
    assert ops[1].shape == (5, 27) and cfg == cc.direct_config(geo, True)
    geo8, scheme8, *_ = cv.conv_plan(torch.randn(2, 8, 9, 8), torch.randn(5, 8, 3, 3), 1, 0, 1, 1)
    assert not geo8.direct and scheme8 == "fp64"  # 8 channels: the implicit GEMM
    assert cv.conv_plan(torch.randn(2, 7, 9, 8), torch.randn(64, 7, 3, 3), 1, 0, 1, 1)[0].direct  # 7 x 64
    assert not cv.conv_plan(torch.randn(2, 7, 9, 8), torch.randn(65, 7, 3, 3), 1, 0, 1, 1)[0].direct  # 7 x 128
    geo_g, scheme_g, *_ = cv.conv_plan(torch.randn(2, 16, 9, 8), torch.randn(4, 4, 3, 3), 1, 0, 1, 4)
    assert geo_g.direct and scheme_g == "direct64"  # 4 channels a group
    assert cv.conv_plan(x, torch.randn(5, 3, 3, 3), 1, 0, 1, 1, scheme="fp16x3p")[1] == "fp16x3p"  # given: kept
    monkeypatch.setattr(cg, "DIRECT_ON", False)
    assert cv.conv_plan(x, torch.randn(5, 3, 3, 3), 1, 0, 1, 1)[1] == "fp64"
    monkeypatch.setattr(cg, "DIRECT_ON", True)
    monkeypatch.setattr(cg, "DENSE_ON", True)  # dense K, turned on, is the explicit choice
    geo_d, scheme_d, *_ = cv.conv_plan(x, torch.randn(5, 3, 3, 3), 1, 0, 1, 1)
    assert geo_d.dense and not geo_d.direct and scheme_d == "fp64"


def test_direct_configs_and_candidates():
    geo = cg.conv_geometry((128, 3, 24, 32, 32), (24, 3, 3, 3, 3), 1, 0, 1, 1)  # KernelBench level 2 problem 23
    default = cc.conv_config(geo, "direct64", interpret=False)
    assert (default.block_m, default.block_n) == (256, 32)
    wide = cc.conv_config(cg.conv_geometry((2, 3, 9, 9), (200, 3, 3, 3), 1, 0, 1, 1), "direct64", False)
    assert (wide.block_m, wide.block_n) == (128, 64)  # 8192 float64 accumulators a program
    cands = cc.conv_candidates(geo, default, "direct64")
    assert cands[0] == default and len(set(cands)) == len(cands) == 1 + len(cc.DIRECT_TUNE_TILES)
    assert all(c.block_n == default.block_n and c.num_stages == 1 for c in cands)


@pytest.mark.parametrize("mode", ["max", "avg", "mean"])
def test_pools_after_a_narrow_conv(mode):
    """A global mean's partials (per sample: conv_mean_forward, on conv_plan) run the direct tile; a windowed pool's
    rows (conv_pool_plan: conv_tile_at at pooled pixels) keep the implicit GEMM. Both against float64 (several row
    tiles: cfg)."""
    x, w, b = _inputs((2, 3, 11, 13), (6, 3, 3, 3), 4)
    assert cg.conv_geometry(tuple(x.shape), tuple(w.shape), 1, 1, 1, 1).direct
    cfg = cc.ConvConfig(16, 8, 16, 4, 1)
    if mode == "mean":
        assert cv.conv_plan(x, w, 1, 1, 1, 1)[1] == "direct64"
        out = pl.conv_mean_forward(x, w, b, 1, 1, 1, 1, cfg=cfg, blocks=(2, 2))
    else:
        assert pl.conv_pool_plan(x, w, 1, 1, 1, 1, 3, 2, 1, 1, False)[2] == "fp64"  # the GEMM tile's scheme here
        out = pl.conv_pool_forward(x, w, b, 1, 1, 1, 1, mode, 3, 2, 1, cfg=cfg)
    kw = {"kernel_size": None} if mode == "mean" else {"kernel_size": 3, "pool_stride": 2, "pool_padding": 1}
    ref = pl.conv_pool_ref(x.double(), w.double(), b.double(), 1, 1, 1, 1, mode, **kw)
    eager = pl.conv_pool_ref(x, w, b, 1, 1, 1, 1, mode, **kw)
    assert out.shape == ref.shape
    assert (out.double() - ref).abs().max().item() <= 2 * (eager.double() - ref).abs().max().item() + 1e-7


def test_direct_tile_at_pooled_pixels():
    """conv_tile_at's direct branch at arbitrary pixels (a pooling kind's rows), given the scheme explicitly."""
    x, w, b = _inputs((2, 3, 11, 13), (6, 3, 3, 3), 6)
    cfg = cc.ConvConfig(16, 8, 16, 4, 1)
    out = pl.conv_pool_forward(x, w, b, 1, 1, 1, 1, "max", 2, 2, 0, scheme="direct64", cfg=cfg)
    ref = pl.conv_pool_ref(x.double(), w.double(), b.double(), 1, 1, 1, 1, "max", 2, 2, 0)
    assert (out.double() - ref).abs().max().item() < 1e-6


@pytest.mark.parametrize("scheme", cc.DIRECT_SCHEMES)
def test_direct_compiles_for_sm90(scheme):
    """The direct tile's default config at KernelBench level 2 problem 23's geometry (3 -> 24 channels, 3 x 3 x 3)
    lowers for sm_90 and fits without a spill (Triton's bundled ptxas, no GPU)."""
    geo = cg.conv_geometry((128, 3, 24, 32, 32), (24, 3, 3, 3, 3), 1, 0, 1, 1)
    build = compile_sm90("kfuse.kernels.conv", "conv_bias_kernel", scheme, cc.conv_config(geo, scheme, False))
    assert build["spill"] == 0, build


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the compiled tile: a GPU, TRITON_INTERPRET=0")
@pytest.mark.parametrize("scheme", cc.DIRECT_SCHEMES)
@pytest.mark.parametrize("case", [*DIRECT_CASES, "problem_23"])
def test_direct_on_the_gpu(case, scheme):
    """The compiled direct tile, against float64: within 2x the error of a strict fp32 convolution (cuDNN, TF32 off)
    plus a few ulps, at every odd geometry and at KernelBench level 2 problem 23's full shape."""
    torch.backends.cudnn.allow_tf32 = False
    xs, ws, *geo = DIRECT_CASES.get(case, ((128, 3, 24, 32, 32), (24, 3, 3, 3, 3), 1, 0, 1, 1))
    x, w, b = (t.cuda() for t in _inputs(xs, ws, 5))
    ref = cv.conv_ref(x.double(), w.double(), b.double(), *geo)
    strict = (cv.conv_ref(x, w, b, *geo).double() - ref).abs().max().item()
    assert cv.conv_plan(x, w, *geo)[1] == "direct32"  # a GPU's default for few channels a group
    out = cv.conv_forward(x, w, b, *geo, scheme=scheme)
    err = (out.double() - ref).abs().max().item()
    assert err <= 2 * strict + 4 * 2.0 ** -24 * max(1.0, ref.abs().max().item()), (xs, err, strict)
