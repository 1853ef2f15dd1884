"""The faster backward (docs/training.md, benchmarks/train/NOTES.md): z kept from the forward kernel, the fused
dZ kernel for pointwise epilogues, the backward GEMMs' operand preparation. CPU interpreter, odd sizes
(37 x 70 -> 129); GPU tests marked `gpu`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kfuse_testing import SEEDS, SMALL
from test_training import compile_to, gradient_contract, pair, region_problem
from kfuse.gradients import run_backward
from kfuse.load import load_problem


def no_recompute(module, monkeypatch) -> list:
    """Make the generated file's z recomputation record its calls (the saved z should make it unneeded)."""
    calls = []
    orig = module.FusedGemmFn.recompute_z

    def counting(*a):
        calls.append(1)
        return orig(*a)
    monkeypatch.setattr(module.FusedGemmFn, "recompute_z", staticmethod(counting))
    return calls


@pytest.mark.parametrize("case", ["epilogue_mul_leaky", "epilogue_two_outputs", "matmul_no_bias", "groupnorm",
                                  "groupnorm_wide", "batchnorm_scale"])
def test_forward_keeps_z(tmp_path, monkeypatch, case):
    """Training-mode backward uses the z the forward kernel stored: no GEMM recomputed, gradients in contract."""
    prob = region_problem(tmp_path, case)
    compiled, module = compile_to(prob, tmp_path)
    assert "def launch_z(" in compiled.source
    calls = no_recompute(module, monkeypatch)
    gradient_contract(prob, module, train=True, draws=1)
    assert not calls


def test_batchnorm_eval_recomputes_z(tmp_path, monkeypatch):
    """Eval mode folds the BatchNorm into W (no z formed): backward falls back to recomputing z, still exact."""
    prob = region_problem(tmp_path, "batchnorm_scale")
    _, module = compile_to(prob, tmp_path)
    calls = no_recompute(module, monkeypatch)
    gradient_contract(prob, module, train=False, draws=1)
    assert calls


@pytest.mark.parametrize("name", sorted(SMALL))
def test_saved_z_is_the_gemm_output(tmp_path, name):
    """The z a launcher returns with save_z=True is x W^T + b (fp32 accurate), and the outputs are unchanged."""
    prob = load_problem(SEEDS / f"{name}.py", SMALL[name])
    _, module = compile_to(prob, tmp_path)
    _, new, _ = pair(prob, module)
    new.train()
    fn = next(v for k, v in vars(module).items() if k.endswith("Fn") and getattr(v, "launch_z", None))
    x = prob.inputs()[0]
    with torch.no_grad():
        outs, z = fn.launch_z(new, x)
        plain = fn.launch(new, x)
    lin = next(m for m in new.modules() if isinstance(m, torch.nn.Linear))
    want = x.double() @ lin.weight.double().t() + lin.bias.double()
    assert z.dtype == x.dtype and z.shape == want.shape
    torch.testing.assert_close(z.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0], plain if torch.is_tensor(plain) else plain[0], atol=1e-6, rtol=1e-6)
