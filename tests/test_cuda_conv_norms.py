"""`--backend cuda`'s norm after a convolution (kfuse/cuda/conv_norms.py, conv_norm_source.py): convolution -> ops ->
GroupNorm or InstanceNorm -> ops as the convolution's launches storing the norm's input, then one norm pass (float64
statistics per (sample, group) over its contiguous run, in chunks, the apply with the ops after the norm). On unless
KFUSE_CUDA_CONV_NORMS=0 (the A/B against the norm as a torch call).

Without a GPU: the switch decides the partition and the reason given for the torch calls, the emitted files are
complete, the CUDA source compiles with nvcc for sm_80 and sm_90 without spills (both convolution tiles), the C++
glue with g++, and autograd through the generated Function with torch in place of the kernels meets the gradient
contract. With a GPU: the problems/conv norm files meet the accuracy contract on both tiles.
"""

from __future__ import annotations

import shutil

import pytest

from kfuse.cuda.regions import unfused_reasons
from kfuse_testing import ROOT, requires_cuda, write_conv_problem
from test_cuda_backend import _contract, check_emitted, compile_cuda, cpp_syntax_errors
from test_cuda_conv import built_without_spills, sources, torch_in_place_gradients

CONV = ROOT / "problems" / "conv"
SWITCH = "KFUSE_CUDA_CONV_NORMS"
# GroupNorm with a residual of the norm's input, InstanceNorm on a batch of one, a transposed 3-d convolution before
# a GroupNorm, a 1-d one with one wide group
NORM_FILES = ["36_conv2d_groupnorm_tanh_residual", "37_conv2d_instancenorm2d_divide_batch1",
              "38_conv_transpose3d_relu_groupnorm_hardswish", "39_conv1d_groupnorm_wide_group"]
PACKED = {"in_channels": 16}  # 16 input channels: the implicit-GEMM tile (the files' own sizes run the direct tile)


@pytest.fixture
def on(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)  # on by default


@pytest.fixture
def off(monkeypatch):
    monkeypatch.setenv(SWITCH, "0")


@pytest.mark.parametrize("name", NORM_FILES)
def test_switched_off_the_norm_stays_a_torch_call_with_the_reason(off, name):
    (v,) = compile_cuda(CONV / f"{name}.py").variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_epilogue"]
    reasons = list(unfused_reasons(v).values())
    assert reasons and all(f"its CUDA version is off ({SWITCH}=0)" in why for why in reasons), reasons


@pytest.mark.parametrize("overrides", [{}, PACKED], ids=["direct", "packed"])
@pytest.mark.parametrize("name", NORM_FILES)
def test_switched_on_the_region_is_one_and_the_file_complete(on, name, overrides):
    compiled = compile_cuda(CONV / f"{name}.py", overrides)
    (v,) = compiled.variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_groupnorm"] and not v.unfused
    check_emitted(compiled.source)
    assert "kf_conv_norm(u, B, C, P, group" in compiled.source
    assert "kf_conv_stat_chunks(1, B * groups" in compiled.source  # a few long runs still fill the GPU
    if overrides:  # 16 input channels: the implicit-GEMM tile (36-38 at their own sizes: the direct tile)
        assert "return kf_conv(g, epi, stream);" in compiled.source


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("overrides", [{}, PACKED], ids=["direct", "packed"])
def test_norm_source_compiles_without_spills(on, tmp_path, arch, overrides):
    """problems/conv/38 (a transposed convolution, ReLU, GroupNorm, HardSwish) on each tile."""
    source = sources(CONV / "38_conv_transpose3d_relu_groupnorm_hardswish.py", overrides)["CUDA_SRC"]
    entries = built_without_spills(source, arch, tmp_path)
    tile = "kf_conv_fp16x3p_kernel" if overrides else "kf_conv_direct_kernel"
    for kernel in ("kf_conv_norm_apply_kernel", "kf_chunk_stats_kernel", "kf_bn_finalize_kernel", tile):
        assert any(kernel in e for e in entries), (kernel, entries)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("name", ["36_conv2d_groupnorm_tanh_residual", "37_conv2d_instancenorm2d_divide_batch1"])
def test_norm_cpp_glue_compiles_against_torch_headers(on, tmp_path, name):
    ns = sources(CONV / f"{name}.py", PACKED)
    assert cpp_syntax_errors(ns, tmp_path) == ""


@pytest.mark.parametrize("name", NORM_FILES)
def test_backward_meets_the_gradient_contract_with_torch_in_place_of_the_kernels(on, tmp_path, monkeypatch, name):
    verdict = torch_in_place_gradients(CONV / f"{name}.py", tmp_path, monkeypatch)
    assert verdict.correct, verdict.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("overrides", [{}, PACKED], ids=["direct", "packed"])
@pytest.mark.parametrize("name", NORM_FILES)
def test_gpu_norm_files_meet_the_contract(on, name, overrides):
    _, _, contract = _contract(CONV / f"{name}.py", overrides)
    assert contract.correct, contract.failures


# ---- BatchNorm after a convolution ---------------------------------------------------------------------------------
# training-mode statistics with a ReLU after; an odd shape with a scale; a transposed 3-d convolution (the mean after
# it a torch call); ops before the norm; eval mode set in the constructor (the running statistics)
BN_FILES = ["18_conv2d_batchnorm_relu", "32_conv2d_batchnorm_scale_odd", "33_conv_transpose3d_batchnorm_subtract_mean",
            "34_conv2d_softplus_tanh_multiply_batchnorm", "35_conv1d_batchnorm1d_eval_gelu"]


@pytest.mark.parametrize("overrides", [{}, PACKED], ids=["own", "packed"])
@pytest.mark.parametrize("name", BN_FILES)
def test_batchnorm_region_is_one_and_the_file_complete(name, overrides):
    compiled = compile_cuda(CONV / f"{name}.py", overrides)
    (v,) = compiled.variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_batchnorm"]
    check_emitted(compiled.source)
    assert "kf_conv_batch_norm(u, B, C, P, batch, part" in compiled.source
    assert "batch, factor = batch_norm_mode(bn)" in compiled.source and "batch_norm_state(" in compiled.source
    assert "rewrites applied: bn-eval-fold" not in compiled.source  # no fold: the pass applies the running statistics


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("overrides", [{}, PACKED], ids=["own", "packed"])
def test_batchnorm_source_compiles_without_spills(tmp_path, arch, overrides):
    """problems/conv/33 (a transposed 3-d convolution, BatchNorm3d) on each tile."""
    source = sources(CONV / "33_conv_transpose3d_batchnorm_subtract_mean.py", overrides)["CUDA_SRC"]
    entries = built_without_spills(source, arch, tmp_path)
    for kernel in ("kf_chunk_stats_kernel", "kf_bn_finalize_kernel", "kf_bn_running_kernel",
                   "kf_conv_norm_apply_kernel"):
        assert any(kernel in e for e in entries), (kernel, entries)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_batchnorm_cpp_glue_compiles_against_torch_headers(tmp_path):
    ns = sources(CONV / "32_conv2d_batchnorm_scale_odd.py", PACKED)
    assert cpp_syntax_errors(ns, tmp_path) == ""


@pytest.mark.parametrize("name", BN_FILES)
def test_batchnorm_backward_meets_the_gradient_contract_with_torch_in_place_of_the_kernels(tmp_path, monkeypatch,
                                                                                           name):
    verdict = torch_in_place_gradients(CONV / f"{name}.py", tmp_path, monkeypatch)
    assert verdict.correct, verdict.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("overrides", [{}, PACKED], ids=["own", "packed"])
@pytest.mark.parametrize("name", BN_FILES)
def test_gpu_batchnorm_files_meet_the_contract(name, overrides):
    """The contract's buffers rule: the running statistics and the batch count end as torch's."""
    _, _, contract = _contract(CONV / f"{name}.py", overrides)
    assert contract.correct, contract.failures


# a windowed pool after the norm: the registry's kinds run their apply pass in the pool's rows; this backend's pass
# stores every value at the convolution's shape, so its region stops before the pool (which stays a torch call)
NORM_THEN_POOL = {
    "groupnorm_maxpool": ("self.conv = nn.Conv2d(3, 8, 3)\nself.gn = nn.GroupNorm(4, 8)\n"
                          "self.pool = nn.MaxPool2d(3, stride=2, padding=1)",
                          "return torch.clamp(self.pool(self.gn(self.conv(x)) * 2.0), -0.5, 0.5)", "3, 11, 9"),
    "batchnorm_avgpool": ("self.conv = nn.ConvTranspose2d(3, 4, 3, stride=2)\nself.bn = nn.BatchNorm2d(4)\n"
                          "self.pool = nn.AvgPool2d(2)", "return torch.tanh(self.pool(self.bn(self.conv(x))))",
                          "3, 7, 6"),
}


@pytest.mark.parametrize("name", NORM_THEN_POOL)
def test_a_pool_after_the_norm_stays_a_torch_call_with_the_reason(on, tmp_path, name):
    compiled = compile_cuda(write_conv_problem(tmp_path, name, *NORM_THEN_POOL[name], batch=2))
    assert compiled.fallback is None
    (v,) = compiled.variants
    assert [r.kind for r in v.regions if r.fused] in (["conv_groupnorm"], ["conv_batchnorm"])
    reasons = unfused_reasons(v)
    assert len(reasons) == 2 and all("the CUDA version stops before the pool" in why for why in reasons.values()), \
        reasons
    check_emitted(compiled.source)
