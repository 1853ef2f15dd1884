"""problems/conv/: the convolution-anchored family in KernelBench format. A few are optimized at small odd sizes in
the interpreter and checked with the accuracy contract (the convolution inside a fused region, nothing left as a
torch call), and their ModelNew trained against eager (the gradient contract)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from kfuse.gradients import gradient_contract
from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module, optimize
from kfuse_testing import ROOT, long_lines, requires_cuda

CONV = ROOT / "problems" / "conv"
PROBLEMS = sorted(CONV.glob("*.py"))
CPU = Options(device="cpu", trials=2)
# A few that between them cover a per-channel parameter and a scalar (02), no bias at odd sizes with a 3x2 kernel
# and stride (08), a grouped, strided and dilated Conv2d (06), the functional form (09), Conv3d with a (C, 1, 1, 1)
# scale (04). Depthwise convolutions (05, 11) run on the direct tile (kernels/conv_depthwise.py) inside a
# conv_epilogue region; a depthwise transposed one (25) stays a torch call (regions/conv_common.depthwise).
RUN = ["02_conv2d_bias_scale", "08_conv2d_odd_nobias_clamp", "06_grouped_strided_dilated_conv2d_tanh",
       "09_functional_conv2d_same_mish", "04_conv3d_swish_scale"]
DEPTHWISE = {"05_depthwise_conv2d_hardswish": [("conv_epilogue", ["conv", "hardswish"])],
             "11_conv1d_depthwise_same_silu_residual": [("conv_epilogue", ["conv", "silu", "add"])]}
DEPTHWISE_TRANSPOSED = "25_conv_transpose2d_depthwise_hardswish"
# Transposed convolutions (kernels/conv_transpose.py): stride 3 with dilation and output_padding in 1-d (20), batch 1
# 3-d with asymmetric strides and no bias (22), two outputs (26); training: grouped and dilated (21), the functional
# form with a stride larger than the kernel's phases hold taps for (23)
TRANSPOSED = ["20_conv_transpose1d_stride3_dilated_gelu", "22_conv_transpose3d_batch1_asymmetric_nobias_leakyrelu",
              "26_conv_transpose1d_batch1_two_outputs_hardsigmoid"]
TRANSPOSED_TRAINS = ["21_conv_transpose2d_grouped_dilated_scale_tanh",
                     "23_functional_conv_transpose2d_stride3_clamp_bias"]


def small(path: Path) -> dict[str, int]:
    """Batch 3 (1 where the problem is about a batch of one), spatial sizes of 5 to 19, 6 channels
    where one number sets them all (depthwise: a group per channel, a launch column each)."""
    consts = load_problem(path).constants()
    sizes = {"batch_size": 1 if "batch1" in path.stem else 3, "height": 11, "width": 9, "depth": 5, "length": 19,
             "channels": 6}
    return {k: v for k, v in sizes.items() if k in consts}


def test_enough_problems_in_kernelbench_format():
    assert len(PROBLEMS) >= 30
    for path in PROBLEMS:
        tree = ast.parse(path.read_text())
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        consts = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        assert {"Model", "get_inputs", "get_init_inputs"} <= names, path.name
        assert "batch_size" in consts, path.name


@pytest.mark.parametrize("stem", RUN[:3] + TRANSPOSED)
def test_problem_small(tmp_path, stem):
    path = CONV / f"{stem}.py"
    result = optimize(load_problem(path, small(path)), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["conv_epilogue"]
    assert result.compiled.unfused == []
    assert not long_lines(result.compiled.source)


@pytest.mark.parametrize("stem", RUN[2:] + TRANSPOSED_TRAINS)
def test_problem_trains(tmp_path, stem):
    """ModelNew's gradients (input and every parameter) meet rules 2 and 3 against eager and float64."""
    path = CONV / f"{stem}.py"
    prob = load_problem(path, small(path))
    compiled = compile_problem(prob, CPU)
    assert [r.kind for r in compiled.regions] == ["conv_epilogue"]
    out = tmp_path / f"{stem}_new.py"
    out.write_text(compiled.source)
    verdict = gradient_contract(prob, load_module(out).ModelNew, draws=1)
    assert verdict.correct, verdict.failures


def test_conv_then_transposed_conv_are_two_regions(tmp_path):
    """problems/conv/30: a strided Conv2d + ReLU feeding a ConvTranspose2d + sigmoid, each form its own region."""
    path = CONV / "30_conv2d_down_conv_transpose2d_up.py"
    result = optimize(load_problem(path, small(path)), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [("conv_epilogue", ["conv", "relu"]),
                                                                    ("conv_epilogue", ["conv_transpose", "sigmoid"])]


@pytest.mark.parametrize("stem", DEPTHWISE)
def test_depthwise_is_fused_and_verified(tmp_path, stem):
    path = CONV / f"{stem}.py"
    result = optimize(load_problem(path, small(path)), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == DEPTHWISE[stem]
    assert not result.compiled.unfused


def test_depthwise_transposed_stays_a_torch_call_and_is_verified(tmp_path):
    path = CONV / f"{DEPTHWISE_TRANSPOSED}.py"
    result = optimize(load_problem(path, small(path)), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert "conv_epilogue" not in [r.kind for r in result.compiled.regions]
    assert any("Conv" in u for u in result.compiled.unfused)


# BatchNorm after the convolution (regions/conv_batchnorm.py): training-mode statistics over a strided Conv2d's row
# tiles (32), over a ConvTranspose3d's stride phases with the spatial mean after it a torch call (33), and eval mode
# as constructed, folded into the weights (35)
BATCHNORM = {"32_conv2d_batchnorm_scale_odd": ["conv_batchnorm"],
             "33_conv_transpose3d_batchnorm_subtract_mean": ["conv_batchnorm", "torch", "torch"],
             "35_conv1d_batchnorm1d_eval_gelu": ["conv_batchnorm"]}


@pytest.mark.parametrize("stem", BATCHNORM)
def test_batchnorm_problem(tmp_path, stem):
    path = CONV / f"{stem}.py"
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == BATCHNORM[stem]


# Groups of fewer than 8 input channels, in every kind that runs the convolution's tile: the plain epilogue at odd
# sizes without bias (08), training BatchNorm (32), GroupNorm with a residual (36), a softmax over the channels (41),
# an overlapping max pool (44) and the global average pool's two phases (46); each on the three walks such a group
# can take
FEW_CHANNELS = {"08_conv2d_odd_nobias_clamp": "conv_epilogue", "32_conv2d_batchnorm_scale_odd": "conv_batchnorm",
         "36_conv2d_groupnorm_tanh_residual": "conv_groupnorm", "41_conv3d_batch1_softmax_bias_sigmoid":
         "conv_channel_reduce", "44_conv2d_hardswish_maxpool_overlapping_mish": "conv_pool",
         "46_conv2d_gelu_global_avgpool_scale": "conv_pool"}
# the environment of each walk, read by the generated file's conv_geometry when it loads: the direct tile (the
# default, kernels/conv_direct.py), the implicit GEMM with each tap's channels padded (KFUSE_CONV_DIRECT=0), dense K's
# im2col rows (KFUSE_CONV_DENSE=1, opt-in)
WALKS = {"direct": {}, "padded": {"KFUSE_CONV_DIRECT": "0"}, "dense": {"KFUSE_CONV_DENSE": "1"}}


def _walk_taken(module, cin_g: int, cout_g: int, windowed: bool) -> str:
    """The walk the file's rules give (a windowed pool's plan never takes the direct tile: conv_pool_plan)."""
    if module.dense_k(cin_g):
        return "dense"
    return "direct" if module.direct_k(cin_g, cout_g) and not windowed else "padded"


@pytest.mark.parametrize("walk", WALKS)
@pytest.mark.parametrize("stem", FEW_CHANNELS)
def test_few_channels_in_every_kind(tmp_path, monkeypatch, stem, walk):
    for name, value in WALKS[walk].items():
        monkeypatch.setenv(name, value)
    path = CONV / f"{stem}.py"
    result = optimize(load_problem(path, small(path)), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert FEW_CHANNELS[stem] in [r.kind for r in result.compiled.regions]
    out = tmp_path / f"{walk}.py"
    out.write_text(result.compiled.source)
    module = load_module(out)
    anchor = load_problem(path, small(path)).build()
    conv = next(m for m in anchor.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)))
    windowed = stem.startswith("44_")  # 44's max pool is windowed, 46's global average pool a mean
    taken = _walk_taken(module, conv.in_channels // conv.groups, conv.out_channels // conv.groups, windowed)
    assert taken == ("padded" if walk == "direct" and windowed else walk)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("walk", WALKS)
@pytest.mark.parametrize("stem", FEW_CHANNELS)
def test_few_channels_compiled_on_a_gpu(tmp_path, monkeypatch, stem, walk):
    """Each walk's compiled kernels (the direct tile in float64 on CUDA cores; the padded and dense tiles on the
    tensor cores, fp16x3p) through the contract, at the problems' own sizes."""
    for name, value in WALKS[walk].items():
        monkeypatch.setenv(name, value)
    result = optimize(load_problem(CONV / f"{stem}.py"), Options(device="cuda", trials=2), workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert FEW_CHANNELS[stem] in [r.kind for r in result.compiled.regions]
