"""`--backend cuda`'s convolution kind (kfuse/cuda/conv.py, conv_source.py): a convolution (any groups but depthwise,
not transposed) and the pointwise chain after it as one implicit-GEMM CUDA tile on x's packed records.

Without a GPU: which convolutions the kind takes and why the others stay torch calls, the emitted files are complete,
the CUDA source compiles with nvcc for sm_80 and sm_90 without spills and the C++ glue with g++ against torch's
headers, a model of the kernel's arithmetic (the records, the weight's rows, the tap-by-tap K walk, the scales) in
torch against float64 at odd geometries, and autograd through the generated Function with torch in place of the
kernels. With a GPU: every problems/conv file the kind takes meets the accuracy contract, and the gradient contract.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess

import pytest
import torch

from kfuse.cuda import runtime
from kfuse.cuda.regions import unfused_reasons
from kfuse.kernels.conv_geometry import conv_geometry
from kfuse.load import load_problem
from kfuse.optimize import load_module
from kfuse_testing import ROOT, requires_cuda
from test_cuda_backend import NVCC_FLAGS, _both_contracts, _contract, _detached, check_emitted, compile_cuda, region_fns

CONV = ROOT / "problems" / "conv"
# problems/conv files whose convolution is not depthwise or transposed and has only pointwise ops after it: 1-d, 2-d,
# 3-d, strides, dilation, 'same', groups, batch 1, no bias, two outputs, a 1 x 1 kernel, functional forms
PLAIN = ["01_conv2d_relu", "02_conv2d_bias_scale", "03_conv1d_strided_gelu", "04_conv3d_swish_scale",
         "07_conv2d_batch1_leakyrelu", "08_conv2d_odd_nobias_clamp", "09_functional_conv2d_same_mish",
         "10_conv2d_subtract_subtract_mish", "12_conv2d_pointwise_1x1_hardtanh", "13_conv1d_dilated_strided_softplus",
         "14_conv3d_batch1_gelu_bias", "16_conv2d_stride3_sigmoid_gate", "17_conv2d_two_outputs_relu_tanh",
         "27_conv2d_gelu_tanh_hardsigmoid", "29_conv1d_batch1_scalar_param_clamp_exp",
         "06_grouped_strided_dilated_conv2d_tanh", "15_grouped_conv2d_silu_sub",
         "28_conv3d_grouped_strided_hardswish_div"]
# depthwise, transposed: torch calls with --backend cuda
NOT_TAKEN = ["05_depthwise_conv2d_hardswish", "11_conv1d_depthwise_same_silu_residual",
             "19_conv_transpose2d_output_padding_relu", "21_conv_transpose2d_grouped_dilated_scale_tanh"]


def _fused(name: str) -> list[str]:
    (v,) = compile_cuda(CONV / f"{name}.py").variants
    return [r.kind for r in v.regions if r.fused]


@pytest.mark.parametrize("name", PLAIN)
def test_plain_convolutions_are_one_region_and_the_file_complete(name):
    compiled = compile_cuda(CONV / f"{name}.py")
    (v,) = compiled.variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_epilogue"] and not v.unfused
    check_emitted(compiled.source)
    assert "conv_geometry(" in compiled.source and "kf_conv_fp16x3p_kernel" in compiled.source
    assert "# Convolutions: x packed" in compiled.source  # the header says how the convolution runs


def test_a_file_without_a_convolution_says_nothing_of_them():
    source = compile_cuda(ROOT / "problems" / "gemm" / "04_gemm_divide_sum_scaling.py").source
    assert "# Convolutions:" not in source and "kf_conv" not in source


@pytest.mark.parametrize("name", NOT_TAKEN)
def test_depthwise_and_transposed_convolutions_stay_torch_calls_with_the_reason(name):
    (v,) = compile_cuda(CONV / f"{name}.py").variants
    assert not any(r.fused for r in v.regions)
    reasons = unfused_reasons(v)
    conv = next(why for op, why in reasons.items() if "Conv" in op or "conv" in op)
    assert "no depthwise or transposed convolution" in conv


def test_a_norm_after_the_convolution_stays_a_torch_call_and_the_conv_is_fused():
    (v,) = compile_cuda(CONV / "18_conv2d_batchnorm_relu.py").variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_epilogue"]
    assert any("conv_batchnorm region, which has no CUDA version" in why for why in unfused_reasons(v).values())


def _sources(name: str) -> dict:
    source = compile_cuda(CONV / f"{name}.py").source
    return {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(source).body
            if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
            and n.targets[0].id in ("CUDA_SRC", "CPP_SRC", "CUDA_FUNCTIONS")}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["80", "90"])
def test_conv_source_compiles_without_spills(tmp_path, arch):
    """problems/conv/17 (two outputs, a bias, a scalar) for sm_80 and sm_90: both tiles, the pipeline depths, the
    pack."""
    (tmp_path / "k.cu").write_text(_sources("17_conv2d_two_outputs_relu_tanh")["CUDA_SRC"])
    r = subprocess.run(["nvcc", "-c", "k.cu", "-o", "k.o", "-std=c++20", *NVCC_FLAGS,
                        f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert spills and set(spills) == {"0"}, r.stderr[-4000:]
    entries = re.findall(r"Compiling entry function '(\w+)'", r.stderr)
    for kernel in ("kf_conv_fp16x3p_kernelILi3ELi4ELi64E", "kf_conv_fp16x3p_kernelILi2ELi4ELi64E",
                   "kf_conv_fp16x3p_kernelILi2ELi4ELi32E", "kf_conv_fp16x3p_kernelILi3ELi2ELi32E",
                   "kf_conv_pack_kernel", "kf_sample_amax_kernelILb1E", "kf_sample_amax_kernelILb0E"):
        assert any(kernel in e for e in entries), (kernel, entries)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_conv_cpp_glue_compiles_against_torch_headers(tmp_path):
    from test_cuda_backend import cpp_syntax_errors

    ns = _sources("02_conv2d_bias_scale")
    assert cpp_syntax_errors(ns["CPP_SRC"], ns["CUDA_FUNCTIONS"], tmp_path) == ""


# ---- the kernel's arithmetic, modelled in torch on the CPU ---------------------------------------------------------
def pow2_scales(amax: torch.Tensor) -> torch.Tensor:
    """kf_pow2_scale: 2^(14 - floor(log2 amax)) from amax's exponent bits, the field clamped to [2, 252]."""
    e = (amax.float().view(torch.int32) >> 23) & 0xFF
    return (torch.clamp(127 + 14 + 127 - e, 2, 252) << 23).view(torch.float32)


def split(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hi = v.half()
    return hi, (v - hi.float()).half()


BLOCK_K = 32  # the tile's K block (gemm_source.BLOCK_K)


def conv_model(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int = 1,
               block_k: int = BLOCK_K) -> torch.Tensor:
    """What kf_conv_pack and kf_conv_fp16x3p_kernel compute, with the kernel's layouts and index arithmetic: x's
    records (B S, 2 G CP) scaled per sample, each group's channels padded to CP, the weight's rows
    (runtime.conv_weight_rows) split per output channel, then per group and K block each 8-wide piece's tap and
    channels, each output pixel's input pixel (zero in the padding and past the last tap), the block's three products
    summed exactly and added to an fp32 accumulator, the scales undone."""
    geo = conv_geometry(tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups)
    cp = runtime.conv_channels(geo.CIN_G)
    taps = geo.KD * geo.KH * geo.KW
    B, S = x.shape[0], geo.D * geo.H * geo.W
    sx = pow2_scales(x.reshape(B, -1).abs().amax(1))
    v = torch.zeros(B, S, groups, cp)
    v[..., :geo.CIN_G] = (x.reshape(B, groups, geo.CIN_G, S) * sx[:, None, None, None]).permute(0, 3, 1, 2)
    x_hi, x_lo = split(v.reshape(B * S, groups * cp))
    rows = runtime.conv_weight_rows(weight, cp)
    sw = pow2_scales(rows.abs().amax(1))
    w_hi, w_lo = split(rows * sw[:, None])
    m = torch.arange(geo.M)
    P = geo.OD * geo.OH * geo.OW
    b, p = m // P, m % P
    od, oh, ow = p // (geo.OW * geo.OH), (p // geo.OW) % geo.OH, p % geo.OW
    acc = torch.zeros(geo.M, geo.C_out)
    for k0, g in ((k0, g) for g in range(groups) for k0 in range(0, taps * cp, block_k)):
        cols = slice(g * geo.COUT_G, (g + 1) * geo.COUT_G)
        a_hi, a_lo = torch.zeros(geo.M, block_k), torch.zeros(geo.M, block_k)
        b_hi, b_lo = torch.zeros(geo.COUT_G, block_k), torch.zeros(geo.COUT_G, block_k)
        for kc in range(0, block_k, 8):
            tap, c = divmod(k0 + kc, cp)
            if tap >= taps:
                continue
            kd, kh, kw = tap // (geo.KW * geo.KH), (tap // geo.KW) % geo.KH, tap % geo.KW
            i_d, i_h, i_w = (od * geo.SD - geo.PD + kd * geo.DD, oh * geo.SH - geo.PH + kh * geo.DH,
                             ow * geo.SW - geo.PW + kw * geo.DW)
            ok = (i_d >= 0) & (i_d < geo.D) & (i_h >= 0) & (i_h < geo.H) & (i_w >= 0) & (i_w < geo.W)
            pix = torch.where(ok, b * S + (i_d * geo.H + i_h) * geo.W + i_w, 0)
            rec = slice(g * cp + c, g * cp + c + 8)
            a_hi[:, kc:kc + 8] = x_hi[pix, rec].float() * ok[:, None]
            a_lo[:, kc:kc + 8] = x_lo[pix, rec].float() * ok[:, None]
            b_hi[:, kc:kc + 8] = w_hi[cols, k0 + kc:k0 + kc + 8].float()
            b_lo[:, kc:kc + 8] = w_lo[cols, k0 + kc:k0 + kc + 8].float()
        ah, al, bh, bl = (t.double() for t in (a_hi, a_lo, b_hi, b_lo))
        acc[:, cols] += (al @ bh.T + ah @ bl.T + ah @ bh.T).float()  # a fresh partial, added in fp32
    out = acc / sx[b][:, None] / sw[None, :]
    return out.reshape(B, P, geo.C_out).transpose(1, 2).reshape(geo.out_shape)


# odd geometries: (x, weight, stride, padding, dilation, groups)
GEOMETRIES = [
    ((2, 5, 7, 9), (6, 5, 3, 2), (2, 1), (1, 0), (1, 2), 1),
    ((1, 37, 11, 13), (70, 37, 3, 3), 1, "same", 1, 1),
    ((3, 3, 19), (5, 3, 4), 3, 2, 2, 1),
    ((2, 4, 5, 6, 7), (3, 4, 3, 3, 2), (1, 2, 1), (1, 1, 0), 1, 1),
    ((2, 64, 6, 6), (9, 64, 1, 1), 1, 0, 1, 1),
    ((2, 15, 9, 10), (12, 5, 3, 3), (2, 1), 1, (1, 2), 3),
    ((1, 6, 4, 5, 6), (4, 3, 2, 3, 3), 1, "same", 1, 2),
]


@pytest.mark.parametrize("x_shape,w_shape,stride,padding,dilation,groups", GEOMETRIES)
@pytest.mark.parametrize("block_k", [32, 64])
def test_kernel_model_matches_float64(x_shape, w_shape, stride, padding, dilation, groups, block_k):
    """The model (the kernel's layouts and K walk, both K block depths) against torch's float64 convolution: within
    fp32's rounding."""
    torch.manual_seed(0)
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    got = conv_model(x, w, stride, padding, dilation, groups, block_k)
    conv = getattr(torch.nn.functional, f"conv{len(x_shape) - 2}d")
    want = conv(x.double(), w.double(), None, stride, padding, dilation, groups)
    assert got.shape == want.shape
    scale = want.abs().max().item()
    assert (got.double() - want).abs().max().item() <= 2e-6 * scale


def test_weight_rows_are_tap_major_with_padded_channels():
    w = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2)
    rows = runtime.conv_weight_rows(w, 8)
    assert rows.shape == (2, 4 * 8)
    for tap, (kh, kw) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        assert torch.equal(rows[:, tap * 8:tap * 8 + 3], w[:, :, kh, kw])
        assert not rows[:, tap * 8 + 3:(tap + 1) * 8].any()


@pytest.mark.parametrize("name", ["04_conv3d_swish_scale", "17_conv2d_two_outputs_relu_tanh",
                                  "29_conv1d_batch1_scalar_param_clamp_exp"])
def test_backward_meets_the_gradient_contract_with_torch_in_place_of_the_kernels(tmp_path, monkeypatch, name):
    from kfuse.gradients import gradient_contract

    path = CONV / f"{name}.py"
    out = tmp_path / "new.py"
    out.write_text(compile_cuda(path).source)
    module = load_module(out)
    fns = region_fns(module, "CudaRecomputeFn")
    assert fns
    for fn in fns:  # the region's own torch reference in place of the kernels
        monkeypatch.setattr(fn, "launch", staticmethod(
            lambda self, x, fn=fn: _detached(fn.reference(self, {}, lambda t: t, x.detach()))))
    verdict = gradient_contract(load_problem(path), module.ModelNew, device="cpu", draws=2)
    assert verdict.correct, verdict.failures


# ---- on a GPU ------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", PLAIN)
def test_gpu_plain_convolutions_meet_the_contract(name):
    _, _, contract = _contract(CONV / f"{name}.py", {})
    assert contract.correct, contract.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ["04_conv3d_swish_scale", "17_conv2d_two_outputs_relu_tanh"])
def test_gpu_gradient_contract(name):
    _both_contracts(CONV / f"{name}.py")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("x_shape,w_shape,stride,padding,dilation,groups",
                         [*GEOMETRIES, ((5, 64, 33, 31), (129, 64, 3, 3), 1, 1, 1, 1)])
def test_gpu_kernel_matches_its_model(tmp_path, x_shape, w_shape, stride, padding, dilation, groups):
    """The CUDA kernels against conv_model at odd geometries: the layouts and the K walk the model checks against
    float64 on the CPU (the tensor core's own truncation within a block: a few fp32 ulps)."""
    torch.manual_seed(0)
    dims = len(x_shape) - 2
    conv = getattr(torch.nn, f"Conv{dims}d")(x_shape[1], w_shape[0], w_shape[2:], stride=stride, padding=padding,
                                             dilation=dilation, groups=groups, bias=False)
    path = tmp_path / "one_conv.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                    "    def __init__(self):\n        super().__init__()\n"
                    f"        self.conv = nn.Conv{dims}d({x_shape[1]}, {w_shape[0]}, {tuple(w_shape[2:])}, "
                    f"stride={stride!r}, padding={padding!r}, dilation={dilation!r}, groups={groups}, bias=False)\n\n"
                    "    def forward(self, x):\n        return self.conv(x)\n\n\n"
                    f"def get_inputs():\n    return [torch.randn{tuple(x_shape)}]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    out = tmp_path / "new.py"
    out.write_text(compile_cuda(path, device="cuda").source)
    module = load_module(out)
    model = module.ModelNew().cuda()
    model.conv.weight.data.copy_(conv.weight)
    x = torch.randn(x_shape)
    with torch.no_grad():
        got = model(x.cuda()).cpu()
    block_k = 32 if w_shape[0] // groups <= 64 else 64  # kf_conv's tile on an sm_90 GPU
    want = conv_model(x, conv.weight.detach(), stride, padding, dilation, groups, block_k)
    exact = torch.nn.functional.__dict__[f"conv{dims}d"](x.double(), conv.weight.detach().double(), None, stride,
                                                          padding, dilation, groups)
    assert got.shape == want.shape
    assert (got.double() - want.double()).abs().max().item() <= 4e-6 * exact.abs().max().item()
