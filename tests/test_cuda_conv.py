"""`--backend cuda`'s convolution kind (kfuse/cuda/conv.py, conv_source.py, conv_runtime.py): a convolution or a
transposed one (any groups, depthwise too) and the pointwise chain after it as one implicit-GEMM CUDA tile on x's
packed records (a launch of it per stride phase of a transposed one), or as the direct tile where a group has fewer
than 8 input channels.

Without a GPU: which convolutions the kind takes and why the others stay torch calls, the emitted files are complete,
the CUDA source compiles with nvcc for sm_80 and sm_90 without spills and the C++ glue with g++ against torch's
headers, a model of the kernel's arithmetic (the records, the weight's rows, the launches, the tap-by-tap K walk, the
scales, where each pixel lands) in torch against float64 at odd geometries of both forms, the direct tile's
arithmetic likewise, and autograd through the generated Function with torch in place of the kernels. With a GPU: every
problems/conv file the kind takes meets the accuracy contract, the gradient contract, and each tile matches its
model (the direct tile: float64 rounded once).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import torch

from kfuse.cuda import conv_runtime
from kfuse.cuda.regions import unfused_reasons
from kfuse.kernels.conv_geometry import conv_geometry
from kfuse.kernels.conv_phases import conv_transpose_geometry
from kfuse.load import load_problem
from kfuse.optimize import load_module
from kfuse_testing import ROOT, requires_cuda
from test_cuda_backend import (
    NVCC_FLAGS,
    _both_contracts,
    _contract,
    _detached,
    check_emitted,
    compile_cuda,
    cpp_syntax_errors,
    emitted_constants,
    region_fns,
    updating_batch_norms,
)

CONV = ROOT / "problems" / "conv"
# problems/conv files whose convolution is neither depthwise nor transposed and has only pointwise ops after it: 1-d,
# 2-d, 3-d, strides, dilation, 'same', groups, batch 1, no bias, two outputs, a 1 x 1 kernel, functional forms
PLAIN = ["01_conv2d_relu", "02_conv2d_bias_scale", "03_conv1d_strided_gelu", "04_conv3d_swish_scale",
         "07_conv2d_batch1_leakyrelu", "08_conv2d_odd_nobias_clamp", "09_functional_conv2d_same_mish",
         "10_conv2d_subtract_subtract_mish", "12_conv2d_pointwise_1x1_hardtanh", "13_conv1d_dilated_strided_softplus",
         "14_conv3d_batch1_gelu_bias", "16_conv2d_stride3_sigmoid_gate", "17_conv2d_two_outputs_relu_tanh",
         "27_conv2d_gelu_tanh_hardsigmoid", "29_conv1d_batch1_scalar_param_clamp_exp",
         "06_grouped_strided_dilated_conv2d_tanh", "15_grouped_conv2d_silu_sub",
         "28_conv3d_grouped_strided_hardswish_div"]
# transposed convolutions with only pointwise ops after them: 1-, 2- and 3-d, output_padding, strides 2 and 3, dilated,
# grouped, batch 1, no bias, a stride longer than the kernel, two outputs, the functional form, padding
TRANSPOSED = ["19_conv_transpose2d_output_padding_relu", "20_conv_transpose1d_stride3_dilated_gelu",
              "21_conv_transpose2d_grouped_dilated_scale_tanh",
              "22_conv_transpose3d_batch1_asymmetric_nobias_leakyrelu",
              "23_functional_conv_transpose2d_stride3_clamp_bias", "24_conv_transpose2d_stride_over_kernel_sigmoid",
              "26_conv_transpose1d_batch1_two_outputs_hardsigmoid", "31_conv_transpose2d_dilated_padded_abs_exp"]
# depthwise ones, transposed too: the direct tile
DEPTHWISE = ["05_depthwise_conv2d_hardswish", "11_conv1d_depthwise_same_silu_residual",
             "25_conv_transpose2d_depthwise_hardswish"]
# the files above that run on the direct tile (fewer than 8 input channels a group at their sizes)
DIRECT_FILES = ["01_conv2d_relu", "04_conv3d_swish_scale", "07_conv2d_batch1_leakyrelu", "08_conv2d_odd_nobias_clamp",
                "10_conv2d_subtract_subtract_mish", "13_conv1d_dilated_strided_softplus", "14_conv3d_batch1_gelu_bias",
                "16_conv2d_stride3_sigmoid_gate", "17_conv2d_two_outputs_relu_tanh", "27_conv2d_gelu_tanh_hardsigmoid",
                "06_grouped_strided_dilated_conv2d_tanh", "28_conv3d_grouped_strided_hardswish_div",
                "21_conv_transpose2d_grouped_dilated_scale_tanh",
                "22_conv_transpose3d_batch1_asymmetric_nobias_leakyrelu", *DEPTHWISE]


def _fused(name: str) -> list[str]:
    (v,) = compile_cuda(CONV / f"{name}.py").variants
    return [r.kind for r in v.regions if r.fused]


@pytest.mark.parametrize("name", PLAIN + TRANSPOSED)
def test_plain_convolutions_are_one_region_and_the_file_complete(name):
    compiled = compile_cuda(CONV / f"{name}.py")
    (v,) = compiled.variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_epilogue"] and not v.unfused
    check_emitted(compiled.source)
    geometry = "conv_transpose_geometry(" if name in TRANSPOSED else "conv_geometry("
    assert geometry in compiled.source and "kf_conv_fp16x3p_kernel" in compiled.source
    assert "# Convolutions: x packed" in compiled.source  # the header says how the convolution runs


def test_a_file_without_a_convolution_says_nothing_of_them():
    source = compile_cuda(ROOT / "problems" / "gemm" / "04_gemm_divide_sum_scaling.py").source
    assert "# Convolutions:" not in source and "kf_conv" not in source


@pytest.mark.parametrize("name", DEPTHWISE)
def test_depthwise_convolutions_run_on_the_direct_tile(name):
    compiled = compile_cuda(CONV / f"{name}.py")
    (v,) = compiled.variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_epilogue"] and not unfused_reasons(v)
    check_emitted(compiled.source)
    assert "return kf_conv_direct(g, epi, stream);" in compiled.source and "return kf_conv(g" not in compiled.source
    assert "direct=True)" in compiled.source  # the launcher asks for the fp32 rows, not the split


@pytest.mark.parametrize("name", PLAIN + TRANSPOSED + DEPTHWISE)
def test_direct_files_are_the_files_on_the_direct_tile(name):
    assert ("return kf_conv_direct(g, epi, stream);" in compile_cuda(CONV / f"{name}.py").source) == (
        name in DIRECT_FILES)


def test_the_tile_follows_the_channels_and_the_switch(monkeypatch):
    """problems/conv/02 (16 channels a group): the implicit-GEMM tile; 07 (3): the direct tile, unless
    KFUSE_CUDA_CONV_DIRECT=0 when the file is generated."""
    assert "return kf_conv(g, epi, stream);" in compile_cuda(CONV / "02_conv2d_bias_scale.py").source
    assert "return kf_conv_direct(g, epi, stream);" in compile_cuda(CONV / "07_conv2d_batch1_leakyrelu.py").source
    monkeypatch.setenv("KFUSE_CUDA_CONV_DIRECT", "0")
    source = compile_cuda(CONV / "07_conv2d_batch1_leakyrelu.py").source
    assert "return kf_conv(g, epi, stream);" in source and "kf_conv_direct(g" not in source


def test_a_convolution_and_a_transposed_one_are_two_regions():
    """problems/conv/30: a strided Conv2d down, then a ConvTranspose2d back up."""
    compiled = compile_cuda(CONV / "30_conv2d_down_conv_transpose2d_up.py")
    (v,) = compiled.variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_epilogue", "conv_epilogue"] and not v.unfused
    assert "conv_transpose_parts(ext, weight, geo)" in compiled.source and "conv_parts(ext" in compiled.source


def test_a_pool_after_the_convolution_stays_a_torch_call_and_the_conv_is_fused():
    """By default (its CUDA version is off: tests/test_cuda_conv_pools.py)."""
    (v,) = compile_cuda(CONV / "45_conv3d_avgpool3d_sigmoid_bias.py").variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_epilogue"]
    assert any("conv_pool region; its CUDA version is off" in why for why in unfused_reasons(v).values())


def sources(path, overrides: dict | None = None) -> dict:
    """The CUDA and C++ sources and the bound functions of a problem's --backend cuda file (`overrides`: its sizes)."""
    return emitted_constants(compile_cuda(path, overrides).source)


# problems/conv/02 (16 channels: the implicit-GEMM tile's instantiations, the pack) and 05 (depthwise: the direct
# tile's, which the first does not build)
BUILDS = {"02_conv2d_bias_scale": ("kf_conv_fp16x3p_kernelILi3ELi4ELi64E",
                                   "kf_conv_fp16x3p_kernelILi2ELi4ELi64E", "kf_conv_fp16x3p_kernelILi2ELi4ELi32E",
                                   "kf_conv_fp16x3p_kernelILi3ELi2ELi32E", "kf_conv_pack_kernel",
                                   "kf_sample_amax_kernelILb1E", "kf_sample_amax_kernelILb0E"),
          "05_depthwise_conv2d_hardswish": ("kf_conv_direct_kernelILi1ELi4E", "kf_conv_direct_kernelILi4ELi4E",
                                            "kf_conv_direct_kernelILi16ELi1E")}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("name", sorted(BUILDS))
def test_conv_source_compiles_without_spills(tmp_path, arch, name):
    """Each tile's instantiations and the pipeline depths for sm_80 and sm_90."""
    entries = built_without_spills(sources(CONV / f"{name}.py")["CUDA_SRC"], arch, tmp_path)
    for kernel in BUILDS[name]:
        assert any(kernel in e for e in entries), (kernel, entries)


def built_without_spills(cuda_src: str, arch: str, tmp_path) -> list[str]:
    """nvcc builds the CUDA source for sm_<arch> with no spill; the kernels it compiled (mangled names)."""
    (tmp_path / "k.cu").write_text(cuda_src)
    r = subprocess.run(["nvcc", "-c", "k.cu", "-o", "k.o", "-std=c++20", *NVCC_FLAGS,
                        f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert spills and set(spills) == {"0"}, r.stderr[-4000:]
    return re.findall(r"Compiling entry function '(\w+)'", r.stderr)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("name", sorted(BUILDS))
def test_conv_cpp_glue_compiles_against_torch_headers(tmp_path, name):
    ns = sources(CONV / f"{name}.py")
    assert cpp_syntax_errors(ns, tmp_path) == ""


# ---- the kernel's arithmetic, modelled in torch on the CPU ---------------------------------------------------------
def pow2_scales(amax: torch.Tensor) -> torch.Tensor:
    """kf_pow2_scale: 2^(14 - floor(log2 amax)) from amax's exponent bits, the field clamped to [2, 252]."""
    e = (amax.float().view(torch.int32) >> 23) & 0xFF
    return (torch.clamp(127 + 14 + 127 - e, 2, 252) << 23).view(torch.float32)


def split(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hi = v.half()
    return hi, (v - hi.float()).half()


BLOCK_K = 32  # the tile's K block (gemm_source.BLOCK_K)


def launches_model(x: torch.Tensor, rows: torch.Tensor, cp: int, launches: list[int], out_shape, groups: int,
                   block_k: int = BLOCK_K, direct: bool = False) -> torch.Tensor:
    """What kf_conv_pack and kf_conv_fp16x3p_kernel compute for a list of launches (kfuse/cuda/conv_runtime.py), with
    the kernel's layouts and index arithmetic: x's records (B S, 2 G CP) scaled per sample, each group's channels
    padded to CP, the weight's rows split per output channel, then per launch, group and K block each 8-wide piece's
    tap and channels (the weight's from the launch's column on), each output pixel's input pixel (zero in the padding
    and past the last tap, the weight's piece too), the block's three products summed exactly and added to an fp32
    accumulator, the scales undone and each pixel stored where the launch lands it. direct: kf_conv_direct_kernel's
    arithmetic instead, x and the rows as they are, their exact products summed in float64, rounded once."""
    F = conv_runtime.LAUNCH_FIELDS
    B = x.shape[0]
    C, D, H, W, c_out, cin_g, cout_g = (launches[i] for i in (1, 2, 3, 4, 8, 9, 10))
    S = D * H * W
    sx = torch.ones(B) if direct else pow2_scales(x.reshape(B, -1).abs().amax(1))
    v = torch.zeros(B, S, groups, cp, dtype=torch.float64 if direct else torch.float32)
    v[..., :cin_g] = (x.reshape(B, groups, cin_g, S) * sx[:, None, None, None]).permute(0, 3, 1, 2)
    sw = torch.ones(rows.shape[0]) if direct else pow2_scales(rows.abs().amax(1))
    if direct:  # no parts: the values themselves (the lo parts zero)
        x_hi, w_hi = v.reshape(B * S, groups * cp), rows.double()
        x_lo, w_lo = torch.zeros_like(x_hi), torch.zeros_like(w_hi)
    else:
        x_hi, x_lo = split(v.reshape(B * S, groups * cp))
        w_hi, w_lo = split(rows * sw[:, None])
    out = torch.full((B, c_out, math.prod(out_shape[2:])), float("nan"))
    for at in range(0, len(launches), F):
        (M, _, _, _, _, OD, OH, OW, _, _, _, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
         FD, FH, FW, RD, RH, RW, UD, UH, UW, col) = launches[at:at + F]
        taps = KD * KH * KW
        m = torch.arange(M)
        P = OD * OH * OW
        b, p = m // P, m % P
        od, oh, ow = p // (OW * OH), (p // OW) % OH, p % OW
        acc = torch.zeros(M, c_out, dtype=torch.float64 if direct else torch.float32)
        for k0, g in ((k0, g) for g in range(groups) for k0 in range(0, taps * cp, block_k)):
            cols = slice(g * cout_g, (g + 1) * cout_g)
            a_hi, a_lo = torch.zeros(M, block_k, dtype=x_hi.dtype), torch.zeros(M, block_k, dtype=x_hi.dtype)
            b_hi, b_lo = torch.zeros(cout_g, block_k, dtype=w_hi.dtype), torch.zeros(cout_g, block_k, dtype=w_hi.dtype)
            for kc in range(0, block_k, 8):
                tap, c = divmod(k0 + kc, cp)
                if tap >= taps:
                    continue
                kd, kh, kw = tap // (KW * KH), (tap // KW) % KH, tap % KW
                i_d, i_h, i_w = od * SD - PD + kd * DD, oh * SH - PH + kh * DH, ow * SW - PW + kw * DW
                ok = (i_d >= 0) & (i_d < D) & (i_h >= 0) & (i_h < H) & (i_w >= 0) & (i_w < W)
                pix = torch.where(ok, b * S + (i_d * H + i_h) * W + i_w, 0)
                rec = slice(g * cp + c, g * cp + c + 8)
                a_hi[:, kc:kc + 8] = x_hi[pix, rec].to(a_hi.dtype) * ok[:, None]
                a_lo[:, kc:kc + 8] = x_lo[pix, rec].to(a_hi.dtype) * ok[:, None]
                wk = slice(col + k0 + kc, col + k0 + kc + 8)
                b_hi[:, kc:kc + 8] = w_hi[cols, wk].to(b_hi.dtype)
                b_lo[:, kc:kc + 8] = w_lo[cols, wk].to(b_hi.dtype)
            ah, al, bh, bl = (t.double() for t in (a_hi, a_lo, b_hi, b_lo))
            acc[:, cols] += (al @ bh.T + ah @ bl.T + ah @ bh.T).to(acc.dtype)  # a fresh partial (fp32: rounded)
        land = ((RD + UD * od) * FH + RH + UH * oh) * FW + RW + UW * ow
        out[b, :, land] = (acc / sx[b][:, None] / sw[None, :]).float()
    return out.reshape(out_shape)


def conv_model(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int = 1,
               block_k: int = BLOCK_K, direct: bool = False) -> torch.Tensor:
    """launches_model of a convolution: its rows (conv_weight_rows), its one launch (conv_runtime.conv_parts')."""
    geo = conv_geometry(tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups)
    cp = conv_runtime.conv_channels(geo.CIN_G)
    ext = SimpleNamespace(split_rows=lambda rows: (rows, None))  # the rows themselves: the model splits them
    rows, _, _, launches = conv_runtime.conv_parts(ext, weight.clone(), geo, direct)
    return launches_model(x, rows, cp, launches, geo.out_shape, groups, block_k, direct)


def conv_transpose_model(x: torch.Tensor, weight: torch.Tensor, stride, padding, output_padding, groups: int,
                         dilation, block_k: int = BLOCK_K, direct: bool = False) -> torch.Tensor:
    """launches_model of a transposed convolution: the phase-ordered rows, a launch per phase with pixels
    (conv_runtime.conv_transpose_parts')."""
    geo = conv_transpose_geometry(tuple(x.shape), tuple(weight.shape), stride, padding, output_padding, groups,
                                  dilation)
    cp = conv_runtime.conv_channels(geo.CIN_G)
    ext = SimpleNamespace(split_rows=lambda rows: (rows, None))
    rows, _, _, launches = conv_runtime.conv_transpose_parts(ext, weight.clone(), geo, direct)
    return launches_model(x, rows, cp, launches, geo.out_shape, groups, block_k, direct)


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


# odd transposed geometries: (x, weight (C_in, C_out / groups, k...), stride, padding, output_padding, groups,
# dilation): strides 2 and 3 with output_padding, dilation coprime with the stride and not, groups, batch 1, a stride
# longer than the kernel (phases with no tap), padding wider than the kernel, 1-, 2- and 3-d, 37 -> 70 channels
TRANSPOSED_GEOMETRIES = [
    ((2, 5, 9), (5, 3, 4), 3, 2, 2, 1, 2),
    ((1, 4, 7), (4, 3, 2), 3, 0, 1, 1, 1),
    ((2, 6, 5, 7), (6, 2, 3, 3), 2, 1, 1, 3, 1),
    ((3, 4, 5, 4), (4, 3, 3, 2), (2, 3), (1, 2), (1, 0), 1, (2, 1)),
    ((2, 3, 4, 5), (3, 4, 3, 3), 2, 1, 1, 1, 2),
    ((1, 3, 7, 6), (3, 5, 2, 3), 1, (2, 3), 0, 1, 1),
    ((1, 4, 3, 4, 3), (4, 3, 2, 3, 2), (2, 1, 2), (0, 1, 1), (1, 0, 1), 2, 1),
    ((1, 37, 5, 6), (37, 70, 4, 4), 2, 1, 0, 1, 1),
]


@pytest.mark.parametrize("x_shape,w_shape,stride,padding,output_padding,groups,dilation", TRANSPOSED_GEOMETRIES)
@pytest.mark.parametrize("block_k", [32, 64])
def test_transposed_kernel_model_matches_float64(x_shape, w_shape, stride, padding, output_padding, groups, dilation,
                                                 block_k):
    """The model of a transposed convolution's launches (the phases' rows of pixels and weight blocks, the K walk
    with the weight zero past a phase's taps, where each pixel lands) against torch's float64 one: every output
    written once, within fp32's rounding."""
    torch.manual_seed(0)
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    got = conv_transpose_model(x, w, stride, padding, output_padding, groups, dilation, block_k)
    fn = getattr(torch.nn.functional, f"conv_transpose{len(x_shape) - 2}d")
    want = fn(x.double(), w.double(), None, stride, padding, output_padding, groups, dilation)
    assert got.shape == want.shape and not got.isnan().any()
    assert (got.double() - want).abs().max().item() <= 2e-6 * want.abs().max().item()


# the direct tile's: depthwise (a channel multiplier, dilation, 'same', 1-d), few channels a group (3-d, grouped) and
# transposed ones (depthwise, strided with output_padding) as (form, x, weight, stride, padding, dilation, groups,
# output_padding)
DIRECT_GEOMETRIES = [
    ("conv", (2, 6, 9, 11), (6, 1, 3, 3), 2, 1, 1, 6, 0),
    ("conv", (1, 4, 7, 8), (8, 1, 3, 2), 1, (1, 0), 2, 4, 0),
    ("conv", (3, 5, 13), (5, 1, 4), 1, "same", 1, 5, 0),
    ("conv", (2, 3, 4, 5, 6), (7, 3, 2, 3, 2), (1, 2, 1), 1, 1, 1, 0),
    ("conv", (2, 6, 8, 7), (9, 2, 3, 3), 1, 1, (2, 1), 3, 0),
    ("transpose", (2, 5, 6, 7), (5, 1, 3, 3), 2, 1, 1, 5, 1),
    ("transpose", (1, 3, 4, 5, 3), (3, 2, 2, 3, 3), (2, 1, 2), (0, 1, 1), 1, 1, (1, 0, 1)),
]


def direct_want(form, x, w, stride, padding, dilation, groups, output_padding) -> torch.Tensor:
    dims = x.dim() - 2
    if form == "conv":
        return getattr(torch.nn.functional, f"conv{dims}d")(x.double(), w.double(), None, stride, padding, dilation,
                                                             groups)
    return getattr(torch.nn.functional, f"conv_transpose{dims}d")(x.double(), w.double(), None, stride, padding,
                                                                   output_padding, groups, dilation)


@pytest.mark.parametrize("form,x_shape,w_shape,stride,padding,dilation,groups,output_padding", DIRECT_GEOMETRIES)
def test_direct_tile_model_matches_float64(form, x_shape, w_shape, stride, padding, dilation, groups, output_padding):
    """The direct tile's arithmetic on the launches (x and the rows as they are, float64 sums): torch's float64
    convolution rounded once to fp32."""
    torch.manual_seed(0)
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    if form == "conv":
        got = conv_model(x, w, stride, padding, dilation, groups, direct=True)
    else:
        got = conv_transpose_model(x, w, stride, padding, output_padding, groups, dilation, direct=True)
    want = direct_want(form, x, w, stride, padding, dilation, groups, output_padding)
    assert got.shape == want.shape and not got.isnan().any()
    assert (got.double() - want).abs().max().item() <= 1e-7 * want.abs().max().item()


def test_weight_rows_are_tap_major_with_padded_channels():
    w = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2)
    rows = conv_runtime.conv_weight_rows(w, 8)
    assert rows.shape == (2, 4 * 8)
    for tap, (kh, kw) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        assert torch.equal(rows[:, tap * 8:tap * 8 + 3], w[:, :, kh, kw])
        assert not rows[:, tap * 8 + 3:(tap + 1) * 8].any()


@pytest.mark.parametrize("name", ["04_conv3d_swish_scale", "17_conv2d_two_outputs_relu_tanh",
                                  "29_conv1d_batch1_scalar_param_clamp_exp",
                                  "21_conv_transpose2d_grouped_dilated_scale_tanh",
                                  "26_conv_transpose1d_batch1_two_outputs_hardsigmoid",
                                  "05_depthwise_conv2d_hardswish", "25_conv_transpose2d_depthwise_hardswish"])
def test_backward_meets_the_gradient_contract_with_torch_in_place_of_the_kernels(tmp_path, monkeypatch, name):
    verdict = torch_in_place_gradients(CONV / f"{name}.py", tmp_path, monkeypatch)
    assert verdict.correct, verdict.failures


def torch_in_place_gradients(path, tmp_path, monkeypatch):
    """The gradient contract (two draws, CPU) of the problem's CUDA ModelNew with each region's own torch reference
    (its CudaRecomputeFn's) in place of its kernels: the generated autograd, not the kernels."""
    from kfuse.gradients import gradient_contract

    out = tmp_path / "new.py"
    out.write_text(compile_cuda(path).source)
    module = load_module(out)
    fns = region_fns(module, "CudaRecomputeFn")
    assert fns
    def torch_launch(self, x, fn):
        with updating_batch_norms(module), torch.no_grad():
            return _detached(fn.reference(self, fn.state(self), lambda t: t, x.detach()))

    for fn in fns:
        monkeypatch.setattr(fn, "launch", staticmethod(lambda self, x, fn=fn: torch_launch(self, x, fn)))
    return gradient_contract(load_problem(path), module.ModelNew, device="cpu", draws=2)


# ---- on a GPU ------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", PLAIN + TRANSPOSED + DEPTHWISE + ["30_conv2d_down_conv_transpose2d_up"])
def test_gpu_plain_convolutions_meet_the_contract(name):
    _, _, contract = _contract(CONV / f"{name}.py", {})
    assert contract.correct, contract.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ["04_conv3d_swish_scale", "17_conv2d_two_outputs_relu_tanh",
                                  "21_conv_transpose2d_grouped_dilated_scale_tanh"])
def test_gpu_gradient_contract(name):
    _both_contracts(CONV / f"{name}.py")


def one_conv_output(tmp_path, form: str, x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation,
                    groups: int, output_padding=0) -> torch.Tensor:
    """The output of `--backend cuda`'s ModelNew of a Model that is one convolution (form "conv") or transposed one
    (no bias) with this weight, on x, on the GPU, generated under the environment the test set."""
    dims = x.dim() - 2
    if form == "conv":
        module = (f"nn.Conv{dims}d({x.shape[1]}, {weight.shape[0]}, {tuple(weight.shape[2:])}, stride={stride!r}, "
                  f"padding={padding!r}, dilation={dilation!r}, groups={groups}, bias=False)")
    else:
        module = (f"nn.ConvTranspose{dims}d({x.shape[1]}, {weight.shape[1] * groups}, {tuple(weight.shape[2:])}, "
                  f"stride={stride!r}, padding={padding!r}, output_padding={output_padding!r}, groups={groups}, "
                  f"dilation={dilation!r}, bias=False)")
    path = tmp_path / "one_conv.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                    f"    def __init__(self):\n        super().__init__()\n        self.conv = {module}\n\n"
                    "    def forward(self, x):\n        return self.conv(x)\n\n\n"
                    f"def get_inputs():\n    return [torch.randn{tuple(x.shape)}]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    out = tmp_path / "new.py"
    out.write_text(compile_cuda(path, device="cuda").source)
    model = load_module(out).ModelNew().cuda()
    model.conv.weight.data.copy_(weight)
    with torch.no_grad():
        return model(x.cuda()).cpu()


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("x_shape,w_shape,stride,padding,dilation,groups",
                         [*GEOMETRIES, ((5, 64, 33, 31), (129, 64, 3, 3), 1, 1, 1, 1)])
def test_gpu_kernel_matches_its_model(tmp_path, monkeypatch, x_shape, w_shape, stride, padding, dilation, groups):
    """The implicit-GEMM tile (the direct tile switched off) against conv_model at odd geometries: the layouts and
    the K walk the model checks against float64 on the CPU (the tensor core's own truncation within a block: a few
    fp32 ulps)."""
    monkeypatch.setenv("KFUSE_CUDA_CONV_DIRECT", "0")
    torch.manual_seed(0)
    x, weight = torch.randn(x_shape), torch.randn(w_shape)
    got = one_conv_output(tmp_path, "conv", x, weight, stride, padding, dilation, groups)
    block_k = 32 if w_shape[0] // groups <= 64 else 64  # kf_conv's tile on an sm_90 GPU
    want = conv_model(x, weight, stride, padding, dilation, groups, block_k)
    exact = direct_want("conv", x, weight, stride, padding, dilation, groups, 0)
    assert got.shape == want.shape
    assert (got.double() - want.double()).abs().max().item() <= 4e-6 * exact.abs().max().item()


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("x_shape,w_shape,stride,padding,output_padding,groups,dilation",
                         [*TRANSPOSED_GEOMETRIES, ((3, 64, 17, 15), (64, 129, 3, 3), 2, 1, 1, 1, 1)])
def test_gpu_transposed_kernel_matches_its_model(tmp_path, monkeypatch, x_shape, w_shape, stride, padding,
                                                 output_padding, groups, dilation):
    """The implicit-GEMM tile's launches for a transposed convolution against conv_transpose_model at odd
    geometries."""
    monkeypatch.setenv("KFUSE_CUDA_CONV_DIRECT", "0")
    torch.manual_seed(0)
    x, weight = torch.randn(x_shape), torch.randn(w_shape)
    got = one_conv_output(tmp_path, "transpose", x, weight, stride, padding, dilation, groups, output_padding)
    block_k = 32 if w_shape[1] <= 64 else 64  # kf_conv's tile on an sm_90 GPU
    want = conv_transpose_model(x, weight, stride, padding, output_padding, groups, dilation, block_k)
    exact = direct_want("transpose", x, weight, stride, padding, dilation, groups, output_padding)
    assert got.shape == want.shape
    assert (got.double() - want.double()).abs().max().item() <= 4e-6 * exact.abs().max().item()


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("form,x_shape,w_shape,stride,padding,dilation,groups,output_padding",
                         [*DIRECT_GEOMETRIES, ("conv", (4, 32, 45, 39), (64, 1, 5, 5), 2, 2, 1, 32, 0)])
def test_gpu_direct_tile_matches_float64(tmp_path, form, x_shape, w_shape, stride, padding, dilation, groups,
                                         output_padding):
    """The direct tile: float64 sums rounded once, so within half an fp32 ulp of the largest output (1e-7 of it)."""
    torch.manual_seed(0)
    x, weight = torch.randn(x_shape), torch.randn(w_shape)
    got = one_conv_output(tmp_path, form, x, weight, stride, padding, dilation, groups, output_padding)
    want = direct_want(form, x, weight, stride, padding, dilation, groups, output_padding)
    assert got.shape == want.shape
    assert (got.double() - want).abs().max().item() <= 1e-7 * want.abs().max().item()
