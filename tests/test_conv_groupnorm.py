"""The conv_groupnorm kind in the interpreter at odd sizes: a convolution (or transposed one) with GroupNorm or
InstanceNorm after it, against float64 with the contract's bound (2 x eager fp32's own error), at the interpreter's
default tile (one row tile holding several samples) and at 16 x 16 tiles (a sample over several row tiles, a tile
holding the end of one sample and the start of the next, a group straddling column tiles); the merge kernels
against their torch reference from partials of uneven segments."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from kfuse.gradients import gradient_contract
from kfuse.kernels.conv_norm import conv_gn_stats, conv_gn_stats_ref
from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module, optimize
from kfuse_testing import ROOT, requires_cuda, tuned_stats_launch, write_conv_problem

# (name, __init__ body, forward body, batch, x's shape after the batch)
CASES = [
    ("conv2d_groupnorm_tanh",
     "self.conv = nn.Conv2d(5, 12, 3, stride=(1, 2), padding=1)\nself.gn = nn.GroupNorm(3, 12)",
     "return torch.tanh(self.gn(self.conv(x))) * 2.0", 3, "5, 9, 11"),
    # stride phases of different sizes, each with its own samples-per-tile
    ("conv_transpose2d_instancenorm_relu",
     "self.conv = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)\n"
     "self.norm = nn.InstanceNorm2d(6, affine=True)",
     "return torch.relu(self.norm(self.conv(x)))", 2, "4, 5, 3"),
    # norm groups of 2 channels across conv groups of 3; no conv bias, no affine; an op before the norm
    ("conv3d_grouped_scale_groupnorm",
     "self.conv = nn.Conv3d(4, 6, (2, 3, 2), groups=2, bias=False)\nself.gn = nn.GroupNorm(3, 6, affine=False)",
     "return self.gn(self.conv(x) * 1.5) + 0.5", 2, "4, 4, 5, 6"),
    # the conv's own value read outside the region: stored by the stats kernel too; batch 1
    ("conv1d_instancenorm1d_two_outputs",
     "self.conv = nn.Conv1d(5, 7, 3, padding=2, dilation=2)\nself.norm = nn.InstanceNorm1d(7)",
     "y = self.conv(x)\nreturn y, torch.sigmoid(self.norm(y))", 1, "5, 19"),
    # functional, groups of 20 channels over 16-wide column tiles, and a residual of the norm's input
    ("functional_groupnorm_wide_residual",
     "self.conv = nn.Conv2d(3, 40, 3)\nself.w = nn.Parameter(torch.randn(40))\nself.b = nn.Parameter(torch.randn(40))",
     "y = self.conv(x)\nreturn y + F.group_norm(y, 2, self.w, self.b, 1e-4)", 3, "3, 7, 8"),
]
CPU = Options(device="cpu", trials=2)
PROBLEMS = ROOT / "problems" / "conv"
# problems/conv with a GroupNorm or InstanceNorm: a residual of the norm's input (36), InstanceNorm2d at batch 1 (37),
# ConvTranspose3d's stride phases (38), F.group_norm over groups of 75 channels (39)
GROUPNORM_PROBLEMS = ["36_conv2d_groupnorm_tanh_residual", "37_conv2d_instancenorm2d_divide_batch1",
                      "38_conv_transpose3d_relu_groupnorm_hardswish", "39_conv1d_groupnorm_wide_group"]


def build(tmp_path: Path, name: str, init: str, forward: str, batch: int, x_shape: str):
    """(problem, compiled, the ModelNew module) of a problem written from the case."""
    prob = load_problem(write_conv_problem(tmp_path, name, init, forward, x_shape, batch))
    compiled = compile_problem(prob, CPU)
    out = tmp_path / f"{name}_new.py"
    out.write_text(compiled.source)
    return prob, compiled, load_module(out)


def outputs(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def check_against_float64(prob, module) -> None:
    """Rule 3 (2 x eager fp32's error against float64 + a small floor) for each output, on two draws."""
    torch.manual_seed(0)
    ref = prob.build()
    new = prob.build(cls=module.ModelNew)
    new.load_state_dict(ref.state_dict())
    f64 = copy.deepcopy(ref).double()
    for draw in range(2):
        torch.manual_seed(10 + draw)
        x = prob.inputs()[0]
        with torch.no_grad():
            for n, e, r in zip(outputs(new(x)), outputs(ref(x)), outputs(f64(x.double()))):
                assert n.dtype == e.dtype and n.shape == e.shape
                assert err(n, r) <= 2 * err(e, r) + 1e-6, (err(n, r), err(e, r))


def small_tiles(module, monkeypatch) -> None:
    """16 x 16 x 16 tiles for every convolution of the generated module (conv_plan and conv_transpose_plan read
    conv_config from the module's globals)."""
    monkeypatch.setattr(module, "conv_config", lambda geo, scheme, interpret: module.ConvConfig(16, 16, 16, 4, 1))


@pytest.mark.parametrize("tiles", ["default", "16x16"])
@pytest.mark.parametrize("name, init, forward, batch, x_shape", CASES, ids=[c[0] for c in CASES])
def test_forward_against_float64(tmp_path, monkeypatch, name, init, forward, batch, x_shape, tiles):
    prob, compiled, module = build(tmp_path, name, init, forward, batch, x_shape)
    assert [r.kind for r in compiled.regions] == ["conv_groupnorm"] and compiled.unfused == []
    if tiles == "16x16":
        small_tiles(module, monkeypatch)
    check_against_float64(prob, module)


def test_eval_mode_normalizes_as_training(tmp_path):
    """GroupNorm has no running statistics: eval mode runs the same three passes."""
    prob, _, module = build(tmp_path, *CASES[0])
    torch.manual_seed(0)
    new = prob.build(cls=module.ModelNew)
    x = prob.inputs()[0]
    with torch.no_grad():
        train = new(x)
        new.eval()
        assert torch.equal(new(x), train)


def test_gradients_through_the_norm(tmp_path):
    """Gradients (input and every parameter, rules 2 and 3), the region recomputed in float64."""
    prob, _, module = build(tmp_path, *CASES[1])
    verdict = gradient_contract(prob, module.ModelNew, draws=1)
    assert verdict.correct, verdict.failures


@pytest.mark.parametrize("n, c, groups, spatial", [(3, 12, 4, 37), (1, 7, 7, 5), (2, 150, 2, 9)])
def test_merge_of_uneven_segments(n, c, groups, spatial):
    """conv_gn_stats from partials of each sample's pixels cut into uneven segments (some entries empty) against
    conv_gn_stats_ref, in float64 to 1e-6 relative."""
    torch.manual_seed(0)
    y = torch.randn(n, c, spatial, dtype=torch.float64) * 3 + 5
    cuts = [0, 1, spatial // 3, spatial // 3, spatial - 1, spatial]  # one repeated cut: an empty entry
    e = len(cuts) - 1
    mean_part = torch.zeros(n, e, c, dtype=torch.float64)
    m2_part = torch.zeros_like(mean_part)
    count = torch.zeros(n, e, dtype=torch.float64)
    for i, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        if hi > lo:
            seg = y[:, :, lo:hi]
            mean_part[:, i] = seg.mean(2)
            m2_part[:, i] = ((seg - seg.mean(2, keepdim=True)) ** 2).sum(2)
            count[:, i] = hi - lo
    eps = 1e-5
    mean, rstd = conv_gn_stats(mean_part, m2_part, count, groups, eps)
    ref_mean, ref_var = conv_gn_stats_ref(y, groups)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rstd.double(), (ref_var + eps).rsqrt(), rtol=1e-6, atol=1e-6)


def contract(tmp_path: Path, stem: str, opts: Options) -> None:
    """The problem at its own sizes through `kfuse optimize`'s accuracy contract, the norm in the fused region."""
    result = optimize(load_problem(PROBLEMS / f"{stem}.py"), opts, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["conv_groupnorm"] and result.compiled.unfused == []


@pytest.mark.parametrize("stem", GROUPNORM_PROBLEMS[2:])
def test_problem_through_the_contract(tmp_path, stem):
    contract(tmp_path, stem, CPU)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("stem", GROUPNORM_PROBLEMS)
def test_problem_compiled_on_a_gpu(tmp_path, stem):
    """The compiled kernels (64-row tiles: samples straddle them) through the contract."""
    contract(tmp_path, stem, Options(device="cuda", trials=2))


def compile_sm90(path: str, name: str, tile: tuple[int, ...]) -> dict:
    """test_conv_kernel's sm_90 build (Triton's bundled ptxas, a fresh process) with the partials' float64 pointers
    and eps typed as the launchers pass them; tile = (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)."""
    import json
    import os
    import subprocess
    import sys

    from test_conv_kernel import COMPILE

    f64 = ("mean_part_ptr", "m2_part_ptr", "count_ptr", "ch_mean_ptr", "ch_m2_ptr")
    script = COMPILE.replace(
        '    elif p.name == "phase_ptr":',
        f'    elif p.name in {f64!r}:\n        signature[p.name] = "*fp64"\n'
        '    elif p.name == "eps":\n        signature[p.name] = "fp32"\n    elif p.name == "phase_ptr":').replace(
        'values = {', 'values = {"BLOCK_E": 32, "BLOCK_C": 64, "BLOCK_G": 8, "BLOCK_J": 16, ')
    out = subprocess.run([sys.executable, "-c", script, json.dumps([path, name, "fp16x3p", *tile, False])],
                         capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="0"), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_kernels_compile_for_sm90(tmp_path):
    """Compiled for sm_90 without a GPU: a transposed convolution's stats kernel (the per-sample loop of float64
    partials after the tile) at the GPU's default tile for 128 channels (64 x 128 x 16, 3 stages), the apply pass at
    its launch tile and the two merge kernels lower. The stats kernel sits at 255 registers and spills 196 bytes on
    the packed tile with the launch's divisibility hints (140 on the element-gather tile without them; conv_batchnorm's,
    without the loop, none; at 64 x 64 or 8 warps none): a speed matter for a GPU run to weigh (level 2 problem 60,
    ConvTranspose3d + GroupNorm, ran at 1.45x eager on an H100 with it), bounded here so that it does not grow
    unnoticed."""
    _, compiled, _ = build(tmp_path, *CASES[1])
    path = str(tmp_path / "generated.py")
    Path(path).write_text(compiled.source)
    stem = "conv_transpose_instance_norm_relu"
    assert compile_sm90(path, f"{stem}_stats_kernel", (64, 128, 16, 4, 3))["spill"] <= 200
    assert compile_sm90(path, f"{stem}_apply_kernel", (64, 32, 32, 4, 1))["spill"] == 0
    for merge in ("conv_gn_channel_kernel", "conv_gn_group_kernel"):
        assert compile_sm90("kfuse.kernels.conv_norm", merge, (0, 0, 0, 4, 1))["spill"] == 0


def test_stats_launch_tunes_with_its_own_partials():
    """The statistics pass's launch is a function of the tile (regions/conv_common.tuned_launch): the partials, sized
    by the tile's rows, are allocated inside it, so each config the tuner times writes its own; then it runs at the
    pick."""
    body = tuned_stats_launch("36_conv2d_groupnorm_tanh_residual.py", "conv_group_norm_tanh_mul_add_stats")
    assert "conv_gn_layout(geo, cfg.block_m)" in body and "mean_part = torch.zeros(" in body


# a mean over the spatial dims of the norm's output: no y stored, no apply pass; `<stem>_mean_kernel` from the float64
# channel and group means (a mean over the channels too: rewrite.py splits it, the channel mean a torch call after)
MEANS = [
    # KernelBench level 2 27's ops: an op before the norm, then a mean over every spatial dim
    ("conv3d_hardswish_groupnorm_mean",
     "self.conv = nn.Conv3d(3, 8, 3)\nself.gn = nn.GroupNorm(4, 8)",
     "return torch.mean(self.gn(F.hardswish(self.conv(x))), dim=[2, 3, 4])", 3, "3, 5, 6, 7"),
    # AdaptiveAvgPool to one pixel (keepdim), ops after it on (N, C, 1, 1) with a per-channel parameter; stride phases
    ("conv_transpose2d_groupnorm_avgpool_bias",
     "self.conv = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1)\nself.gn = nn.GroupNorm(2, 6)\n"
     "self.pool = nn.AdaptiveAvgPool2d(1)\nself.b = nn.Parameter(torch.randn(6, 1, 1))",
     "return torch.tanh(self.pool(self.gn(self.conv(x))) + self.b) * 2.0", 2, "4, 5, 7"),
    # InstanceNorm with affine: each mean is its channel's bias, up to rounding; a Conv1d's mean over its one dim
    ("conv1d_instancenorm_mean",
     "self.conv = nn.Conv1d(5, 7, 3)\nself.norm = nn.InstanceNorm1d(7, affine=True)",
     "return self.norm(self.conv(x)).mean(-1)", 1, "5, 19"),
    # KernelBench level 2 23's mean over the channels and the spatial dims, and the conv's output as a second output
    ("conv2d_groupnorm_mean_all_two_outputs",
     "self.conv = nn.Conv2d(3, 12, 3, padding=1)\nself.gn = nn.GroupNorm(3, 12)",
     "y = self.conv(x)\nreturn y, self.gn(y).mean(dim=[1, 2, 3])", 3, "3, 9, 11"),
]


@pytest.mark.parametrize("tiles", ["default", "16x16"])
@pytest.mark.parametrize("name, init, forward, batch, x_shape", MEANS, ids=[c[0] for c in MEANS])
def test_a_mean_after_the_norm_against_float64(tmp_path, monkeypatch, name, init, forward, batch, x_shape, tiles):
    prob, compiled, module = build(tmp_path, name, init, forward, batch, x_shape)
    fused = [r for r in compiled.regions if r.fused]
    assert [r.kind for r in fused] == ["conv_groupnorm"], compiled.regions
    assert any(n.op in ("mean_dims", "mean") for n in fused[0].nodes)
    assert "_mean_kernel[" in compiled.source and "_apply_kernel" not in compiled.source
    assert compiled.unfused == (["Tensor.mean"] if "mean_all" in name else []), compiled.unfused
    if tiles == "16x16":
        small_tiles(module, monkeypatch)
    check_against_float64(prob, module)


def test_a_mean_after_the_norm_meets_both_contracts(tmp_path):
    prob = load_problem(write_conv_problem(tmp_path, "gn_mean", *MEANS[1][1:3], MEANS[1][4], MEANS[1][3]))
    result = optimize(prob, CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    verdict = gradient_contract(prob, load_module(result.candidate_path).ModelNew, draws=1)
    assert verdict.correct, verdict.failures


def test_a_norm_read_besides_its_mean_keeps_the_apply_pass(tmp_path):
    """The mean's finalize never makes the normalized values: a second use of them leaves the mean to torch."""
    init = "self.conv = nn.Conv2d(3, 4, 3)\nself.gn = nn.GroupNorm(2, 4)"
    forward = "z = self.gn(self.conv(x))\nreturn z, z.mean((2, 3))"
    _, compiled, _ = build(tmp_path, "two", init, forward, 2, "3, 9, 9")
    assert [r.kind for r in compiled.regions if r.fused] == ["conv_groupnorm"]
    assert "_apply_kernel" in compiled.source and compiled.unfused == ["Tensor.mean"], compiled.unfused
