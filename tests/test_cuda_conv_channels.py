"""`--backend cuda`'s reduction over a convolution's channels (kfuse/cuda/conv_channels.py, conv_channels_source.py):
convolution -> ops -> a sum, mean, max, min or logsumexp over dim 1, or a softmax over it -> ops, as the
convolution's launches storing the reduction's input, then one pass a thread a pixel (the statistic over the pixel's
channels, the per-pixel ops, the full-width ops after it).

Without a GPU: each reduction and softmax gives one region and a complete file; the CUDA source compiles with nvcc
for sm_80 and sm_90 without spills (both convolution tiles), the C++ glue with g++; the channel pass's arithmetic,
modelled in torch, agrees with each torch reduction (NaN and infinities too); autograd through the generated
Function with torch in place of the kernels meets the gradient contract. With a GPU: the problems/conv files meet
the accuracy contract on both tiles.
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from kfuse_testing import ROOT, requires_cuda
from test_cuda_backend import _contract, check_emitted, compile_cuda, cpp_syntax_errors
from test_cuda_conv import built_without_spills, sources, torch_in_place_gradients

CONV = ROOT / "problems" / "conv"
# a min over 136 channels (keepdim), a softmax on a batch of one (3-d), a logsumexp of a grouped convolution, two
# regions (a max without keepdim, a sum with it)
CHANNEL_FILES = ["40_conv2d_wide_scale_channel_min_tanh", "41_conv3d_batch1_softmax_bias_sigmoid",
                 "42_conv2d_grouped_logsumexp_hardswish_clamp", "43_conv3d_two_branches_channel_max_sum"]
PACKED = {"in_channels": 24}  # 24 input channels (8 a group in 42): the implicit-GEMM tile


@pytest.mark.parametrize("overrides", [{}, PACKED], ids=["direct", "packed"])
@pytest.mark.parametrize("name", CHANNEL_FILES)
def test_each_file_is_channel_regions_and_complete(name, overrides):
    compiled = compile_cuda(CONV / f"{name}.py", overrides)
    (v,) = compiled.variants
    fused = [r.kind for r in v.regions if r.fused]
    assert fused == ["conv_channel_reduce"] * (2 if name.startswith("43") else 1) and not v.unfused
    check_emitted(compiled.source)
    assert "kf_channel_reduce<" in compiled.source
    direct = not overrides and not name.startswith("40")  # 40: 5 x 136 products a pixel and tap, over the bound
    tile = "kf_conv_direct(g, epi, stream)" if direct else "kf_conv(g, epi, stream)"
    assert f"return {tile};" in compiled.source


REDUCTIONS = {  # the reduction's code -> (its statistic, a Row functor (per-pixel stores) or not, a Post one or not)
    "torch.sum(y, dim=1)": ("<0>", True, False),
    "y.mean(dim=1, keepdim=True) * 2": ("<0>", True, False),
    "torch.amax(y, dim=1, keepdim=True) - y": ("<1>", True, True),  # Row stores the max Post reads
    "torch.min(y, dim=1)[0]": ("<2>", True, False),
    "torch.logsumexp(y, dim=1)": ("<3>", True, False),
    "torch.log_softmax(y, dim=1)": ("<3>", False, True),
}


def reduction_problem(tmp_path, expr: str, transposed: bool = False):
    conv = ("nn.ConvTranspose2d(6, 11, 3, stride=2, output_padding=1)" if transposed else
            "nn.Conv2d(6, 11, (3, 2), padding=1)")
    path = tmp_path / "channel_problem.py"
    path.write_text(f"""
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = {conv}

    def forward(self, x):
        y = torch.tanh(self.conv(x))
        return {expr}

def get_inputs():
    return [torch.randn(3, 6, 9, 7)]

def get_init_inputs():
    return []
""")
    return path


@pytest.mark.parametrize("expr", sorted(REDUCTIONS))
def test_each_reduction_runs_its_statistic_and_functors(tmp_path, expr):
    stat, row, post = REDUCTIONS[expr]
    source = compile_cuda(reduction_problem(tmp_path, expr), {}).source
    check_emitted(source)
    assert f"kf_channel_reduce{stat}(y, B, C, P, divisor" in source
    assert ("KfNoOps row;" not in source) == row and ("KfNoOps post;" not in source) == post
    assert ("divisor = float(geo.out_shape[1])" in source) == ("mean" in expr)


def test_a_transposed_convolution_runs_its_phases_then_the_pass(tmp_path):
    compiled = compile_cuda(reduction_problem(tmp_path, "torch.softmax(y, dim=1)", transposed=True), {})
    (v,) = compiled.variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_channel_reduce"]
    assert "conv_transpose_parts(ext, weight, geo" in compiled.source


# ---- the channel pass's arithmetic, modelled in torch on the CPU ---------------------------------------------------
def channel_pass(y: torch.Tensor, stat: int, divisor: float = 1.0) -> torch.Tensor:
    """kf_channel_reduce_kernel's statistic of each pixel of y (B, C, P), as the kernel computes it."""
    if stat == 0:
        return (y.double().sum(1) / divisor).float()
    nan = torch.isnan(y).any(1)
    v = torch.where(nan, torch.nan, y.amin(1) if stat == 2 else y.amax(1))
    if stat != 3:
        return v
    finite = torch.isfinite(v)
    s = torch.exp(y - torch.where(finite, v, 0).unsqueeze(1)).double().sum(1)
    return torch.where(finite, v + torch.log(s).float(), v)


@pytest.mark.parametrize("stat, reference", [(0, lambda y: y.sum(1)), (1, lambda y: y.amax(1)),
                                             (2, lambda y: y.amin(1)), (3, lambda y: torch.logsumexp(y, 1))])
def test_the_modelled_pass_agrees_with_torch_nan_and_infinities_too(stat, reference):
    y = torch.randn(3, 37, 70) * 4
    y[0, 5, 3], y[1, :, 9], y[2, 7, 11] = math.nan, -math.inf, math.inf
    got, want = channel_pass(y, stat), reference(y)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("overrides", [{}, PACKED], ids=["direct", "packed"])
def test_channel_source_compiles_without_spills(tmp_path, arch, overrides):
    """problems/conv/41 (a softmax: the statistic, then the post functor) on each tile."""
    source = sources(CONV / "41_conv3d_batch1_softmax_bias_sigmoid.py", overrides)["CUDA_SRC"]
    entries = built_without_spills(source, arch, tmp_path)
    tile = "kf_conv_fp16x3p_kernel" if overrides else "kf_conv_direct_kernel"
    for kernel in ("kf_channel_reduce_kernelILi3E", tile):
        assert any(kernel in e for e in entries), (kernel, entries)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("name", ["40_conv2d_wide_scale_channel_min_tanh", "43_conv3d_two_branches_channel_max_sum"])
def test_channel_cpp_glue_compiles_against_torch_headers(tmp_path, name):
    ns = sources(CONV / f"{name}.py", PACKED)
    assert cpp_syntax_errors(ns, tmp_path) == ""


@pytest.mark.parametrize("name", CHANNEL_FILES)
def test_backward_meets_the_gradient_contract_with_torch_in_place_of_the_kernels(tmp_path, monkeypatch, name):
    verdict = torch_in_place_gradients(CONV / f"{name}.py", tmp_path, monkeypatch)
    assert verdict.correct, verdict.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("overrides", [{}, PACKED], ids=["direct", "packed"])
@pytest.mark.parametrize("name", CHANNEL_FILES)
def test_gpu_channel_files_meet_the_contract(name, overrides):
    _, _, contract = _contract(CONV / f"{name}.py", overrides)
    assert contract.correct, contract.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("expr", sorted(REDUCTIONS))
def test_gpu_each_reduction_meets_the_contract(tmp_path, expr):
    _, _, contract = _contract(reduction_problem(tmp_path, expr), {})
    assert contract.correct, contract.failures
