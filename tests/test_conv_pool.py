"""Pools after a convolution (kernels/pooling.py, regions/conv_pool.py) at odd sizes: the kernels against float64
with the contract's bound (2 x eager fp32's own error), in the interpreter and, where there is one, on the GPU; the
problems of problems/conv 44-47 through the accuracy contract and one through the gradient contract."""

from __future__ import annotations

import pytest
import torch

from kfuse.kernels.conv import ConvConfig
from kfuse.kernels.pool_geometry import pooled_size
from kfuse.kernels.pooling import conv_mean_forward, conv_pool_forward, conv_pool_ref
from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module, optimize
from kfuse_testing import ROOT, gradient_verdict, long_lines

CONV = ROOT / "problems" / "conv"
SMALL_TILE = ConvConfig(16, 16, 16, 4, 1)  # several row and column tiles at these sizes (slow in the interpreter)
TILED = ("max2d_nonoverlap_floor", "max1d_dilated_ceil", "avg2d_ceil_nocount")

# (id, x shape, (C_out, C_in/groups, kernel...), conv geometry (stride, padding, dilation, groups), pool mode,
#  pool geometry (kernel_size, stride, padding, dilation, ceil_mode, count_include_pad, divisor_override))
CASES = [
    ("max2d_overlap_pad", (3, 5, 15, 13), (11, 5, 3, 3), (1, 1, 1, 1), "max", (3, 2, 1, 1, False, True, None)),
    ("max2d_nonoverlap_floor", (2, 4, 9, 11), (6, 2, 2, 3), (1, 0, 1, 2), "max", (2, None, 0, 1, False, True, None)),
    ("max1d_dilated_ceil", (1, 3, 29), (7, 3, 3), (2, 1, 1, 1), "max", (3, 2, 1, 2, True, True, None)),
    ("max3d_batch1", (1, 3, 6, 7, 5), (5, 3, 2, 3, 2), (1, 1, 1, 1), "max", ((2, 3, 2), (1, 2, 2), 0, 1, False, True,
                                                                              None)),
    ("avg2d_pad_divisor", (2, 3, 13, 10), (9, 3, 3, 3), (1, 0, 1, 1), "avg", (3, 2, 1, 1, False, True, 5)),
    ("avg2d_ceil_nocount", (3, 4, 12, 9), (5, 4, 3, 2), ((2, 1), 1, 1, 1), "avg", ((3, 2), 2, 1, 1, True, False, None)),
    ("avg3d_nonoverlap", (2, 3, 7, 9, 8), (6, 3, 3, 3, 3), (1, 1, 1, 1), "avg", (2, None, 0, 1, False, True, None)),
    ("avg1d_ceil_pad_count", (2, 5, 23), (4, 5, 4), (1, 2, 1, 1), "avg", (4, 3, 2, 1, True, True, None)),
]


def _pool_args(pool: tuple) -> dict:
    k, s, p, d, ceil, count, div = pool
    return dict(kernel_size=k, pool_stride=s, pool_padding=p, pool_dilation=d, ceil_mode=ceil,
                count_include_pad=count, divisor_override=div)


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def _operands(x_shape, w_shape, groups, device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=g)
    w = torch.randn((w_shape[0] * 1, *w_shape[1:]), generator=g) * 0.3
    b = torch.randn(w_shape[0], generator=g)
    return x.to(device), w.to(device), b.to(device)


def _check(x, w, b, conv, mode, pool, cfg=None, scheme=None):
    stride, padding, dilation, groups = conv
    kw = _pool_args(pool)
    out = conv_pool_forward(x, w, b, stride, padding, dilation, groups, mode, scheme=scheme, cfg=cfg, **kw)
    eager = conv_pool_ref(x, w, b, stride, padding, dilation, groups, mode, **kw)
    f64 = conv_pool_ref(x.double(), w.double(), b.double(), stride, padding, dilation, groups, mode, **kw)
    assert out.shape == eager.shape and out.dtype == eager.dtype
    assert err(out, f64) <= 2 * err(eager, f64) + 1e-6, (err(out, f64), err(eager, f64))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_pool_kernel_against_float64(case):
    _, x_shape, w_shape, conv, mode, pool = case
    x, w, b = _operands(x_shape, w_shape, conv[3])
    _check(x, w, b, conv, mode, pool, cfg=SMALL_TILE if case[0] in TILED else None)


def test_conv_pool_kernel_default_tile_and_fp16_split():
    """The interpreter's one-tile config, and the GPU's fp16 hi/lo products (the interpreter runs them too)."""
    _, x_shape, w_shape, conv, mode, pool = CASES[0]
    x, w, b = _operands(x_shape, w_shape, conv[3])
    _check(x, w, b, conv, mode, pool)
    _check(x, w, b, conv, mode, pool, scheme="fp16x3p")


def test_max_pool_propagates_nan_as_torch():
    _, x_shape, w_shape, conv, mode, pool = CASES[0]
    x, w, b = _operands(x_shape, w_shape, conv[3])
    x[1, 2, 7, 4] = float("nan")
    kw = _pool_args(pool)
    out = conv_pool_forward(x, w, b, *conv, mode, **kw)
    ref = conv_pool_ref(x, w, b, *conv, mode, **kw)
    assert torch.equal(out.isnan(), ref.isnan()) and out.isnan().any()


@pytest.mark.parametrize("x_shape, w_shape, conv, cfg", [
    ((3, 4, 13, 11), (9, 4, 3, 3), (1, 0, 1, 1), SMALL_TILE),  # 11 x 9 pixels: 7 row tiles of 16 a sample
    ((2, 3, 5, 9, 7), (6, 1, 2, 2, 2), (1, 1, 1, 3), None),  # grouped 3-d
    ((1, 6, 41), (4, 6, 5), (2, 2, 1, 1), None),  # batch 1, 1-d, strided
    ((5, 3, 4, 5), (7, 3, 3, 3), (1, 0, 1, 1), SMALL_TILE),  # 6 pixels a sample: slots of 8, two samples a tile
])
def test_conv_mean_two_phases_against_float64(x_shape, w_shape, conv, cfg):
    x, w, b = _operands(x_shape, w_shape, conv[3])
    out = conv_mean_forward(x, w, b, *conv, cfg=cfg, blocks=(2, 2) if cfg else None)  # (2, 2): several steps
    eager = conv_pool_ref(x, w, b, *conv, "mean", None)
    f64 = conv_pool_ref(x.double(), w.double(), b.double(), *conv, "mean", None)
    assert out.shape == eager.shape
    assert err(out, f64) <= 2 * err(eager, f64) + 1e-7, (err(out, f64), err(eager, f64))


def test_pooled_size_matches_torch():
    for size, k, s, p, d, ceil in [(10, 3, 2, 1, 1, True), (11, 4, 3, 2, 1, True), (7, 2, 2, 0, 1, True),
                                   (9, 3, 2, 1, 2, False), (5, 5, 1, 2, 1, True)]:
        y = torch.nn.functional.max_pool1d(torch.zeros(1, 1, size), k, s, p, d, ceil)
        assert pooled_size(size, k, s, p, d, ceil) == y.shape[-1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels need a GPU")
@pytest.mark.parametrize("case", [CASES[0], CASES[5], CASES[6]], ids=lambda c: c[0])
def test_conv_pool_kernel_on_gpu(case, monkeypatch):
    _, x_shape, w_shape, conv, mode, pool = case
    x, w, b = _operands(x_shape, w_shape, conv[3], "cuda")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # eager fp32 as the contract defines it
    _check(x, w, b, conv, mode, pool)
    out = conv_mean_forward(x, w, b, *conv)
    f64 = conv_pool_ref(x.double(), w.double(), b.double(), *conv, "mean", None)
    assert err(out, f64) <= 2 * err(conv_pool_ref(x, w, b, *conv, "mean", None), f64) + 1e-7


CPU = Options(device="cpu", trials=2)


@pytest.mark.parametrize("stem", ["44_conv2d_hardswish_maxpool_overlapping_mish", "46_conv2d_gelu_global_avgpool_scale",
                                  "47_conv1d_batch1_avgpool_ceil_nopad_count"])
def test_pool_problem(tmp_path, stem):
    path = CONV / f"{stem}.py"
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["conv_pool"] and result.compiled.unfused == []
    assert not long_lines(result.compiled.source)


AVG_POOL_1D = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3)
        self.pool = nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False)

    def forward(self, x):
        return self.pool(self.conv(x)) * 2.0


def get_inputs():
    return [torch.randn(2, 4, 17)]


def get_init_inputs():
    return []
'''


def test_avg_pool1d_module_has_no_divisor_override(tmp_path):
    """nn.AvgPool1d (unlike AvgPool2d / 3d) has no divisor_override attribute: the generated call passes None
    instead of reading it from the module (which raised, and optimize fell back to Model's forward)."""
    path = tmp_path / "avg1d.py"
    path.write_text(AVG_POOL_1D)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["conv_pool"]
    assert "self.pool.divisor_override" not in result.compiled.source


@pytest.mark.parametrize("stem", ["45_conv3d_avgpool3d_sigmoid_bias", "46_conv2d_gelu_global_avgpool_scale"])
def test_pool_problem_trains(tmp_path, stem):
    """problems/conv/45 (Conv3d, AvgPool3d, a channel bias after it) and 46 (a global mean, a (C,) scale after it):
    gradients against eager and float64."""
    path = CONV / f"{stem}.py"
    prob = load_problem(path)
    compiled = compile_problem(prob, CPU)
    assert [r.kind for r in compiled.regions] == ["conv_pool"]
    verdict = gradient_verdict(prob, compiled, tmp_path)
    assert verdict.correct, verdict.failures


CHAIN = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d -> MaxPool2d(3, 2, 1) -> ReLU -> global mean -> flatten -> x 2: the pool's rows one sample's pooled
    pixels, float64 partial sums of them, a finalize."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3)
        self.pool = nn.MaxPool2d(3, 2, 1)

    def forward(self, x):
        x = torch.relu(self.pool(self.conv(x)))
        return torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1) * 2.0


batch_size = 3


def get_inputs():
    return [torch.randn(batch_size, 4, 13, 11)]


def get_init_inputs():
    return []
'''


def test_windowed_pool_then_global_mean(tmp_path):
    """Against float64 with the contract's bound at the file's batch (the full contract's extra shape, 40 samples,
    is 40 programs of the interpreter: slow)."""
    path = tmp_path / "chain.py"
    path.write_text(CHAIN)
    prob = load_problem(path)
    compiled = compile_problem(prob, CPU)
    assert [r.kind for r in compiled.regions] == ["conv_pool"] and compiled.unfused == []
    (tmp_path / "new.py").write_text(compiled.source)
    torch.manual_seed(0)
    ref = prob.build()
    new = prob.build(cls=load_module(tmp_path / "new.py").ModelNew)
    new.load_state_dict(ref.state_dict())
    f64 = prob.build().double()
    f64.load_state_dict(ref.state_dict())
    for draw in range(2):
        torch.manual_seed(draw)
        x = prob.inputs()[0]
        with torch.no_grad():
            out, eager, exact = new(x), ref(x), f64(x.double())
        assert out.shape == eager.shape == (3, 6)
        assert err(out, exact) <= 2 * err(eager, exact) + 1e-7, (err(out, exact), err(eager, exact))


def test_windowed_pool_launch_tunes_its_tile():
    """The one-kernel windowed pool's launch goes through tuned_conv (on a GPU: timed on the first call at each
    geometry; on the CPU the default, untimed); so does the global mean's partials kernel, its partials (one slot per
    sample and pixel tile) allocated per launch and T rebound for the finalize."""
    windowed = compile_problem(load_problem(CONV / "44_conv2d_hardswish_maxpool_overlapping_mish.py",
                                            {"batch_size": 2}), Options(device="cpu")).source
    assert "launch(tuned_conv(conv_sub_hardswish_pool_mish_kernel, geo, scheme, cfg, x, launch))" in windowed
    mean = compile_problem(load_problem(CONV / "46_conv2d_gelu_global_avgpool_scale.py", {"batch_size": 2}),
                           Options(device="cpu")).source
    stem = "conv_gelu_mean_dims_mul_tanh_partial_kernel"
    head = mean.index(f"def {stem}_launch(cfg):")
    body = mean[head:mean.index("return part, T\n", head)]
    assert "mean_plan(geo, S, scheme, cfg)" in body and "part = torch.empty((N * T, C)" in body
    assert f"cfg = tuned_conv({stem}, geo, scheme, cfg, x," in mean and f"part, T = {stem}_launch(cfg)" in mean
