"""GroupNorm and BatchNorm1d fused after the GEMM: torch's exact semantics, in the interpreter."""

from __future__ import annotations

import importlib

import pytest
import torch

from kfuse_testing import write_problem
from kfuse.load import load_problem
from kfuse.optimize import Options, load_module, optimize

CPU = Options(device="cpu", trials=2)


@pytest.mark.parametrize("group", [4, 16, 64])
def test_groupnorm_group_sizes(tmp_path, group):
    n = 256
    init = f"self.lin = nn.Linear(in_features, out_features)\nself.gn = nn.GroupNorm(out_features // {group}, out_features, eps=1e-5)"
    path = write_problem(tmp_path, init, "return torch.relu(self.gn(self.lin(x)) * 1.5)", n=n)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [("gemm_groupnorm", ["linear", "group_norm", "mul", "relu"])]


def test_groupnorm_without_affine(tmp_path):
    init = "self.lin = nn.Linear(in_features, out_features)\nself.gn = nn.GroupNorm(8, out_features, affine=False)"
    path = write_problem(tmp_path, init, "return self.gn(self.lin(x))", n=64)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert result.compiled.regions[0].kind == "gemm_groupnorm"


BN_FORWARD = "return torch.relu(self.bn(self.lin(x) * self.s))"


def bn_problem(tmp_path, bn_args: str = "out_features"):
    init = ("self.lin = nn.Linear(in_features, out_features)\nself.s = nn.Parameter(torch.randn(out_features))\n"
            f"self.bn = nn.BatchNorm1d({bn_args})")
    return write_problem(tmp_path, init, BN_FORWARD)


@pytest.mark.parametrize("bn_args", ["out_features", "out_features, momentum=None", "out_features, affine=False",
                                     "out_features, track_running_stats=False"])
def test_batchnorm_training_contract(tmp_path, bn_args):
    """The contract also compares buffers: running_mean/var and num_batches_tracked after the call."""
    result = optimize(load_problem(bn_problem(tmp_path, bn_args)), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [("gemm_batchnorm", ["linear", "mul", "batch_norm", "relu"])]


def _pair(tmp_path):
    prob = load_problem(bn_problem(tmp_path))
    result = optimize(prob, Options(device="cpu", trials=1), workdir=tmp_path)
    module = load_module(result.candidate_path)
    torch.manual_seed(0)
    ref = prob.build()
    new = prob.build(cls=module.ModelNew)
    new.load_state_dict(ref.state_dict())
    return ref, new


def test_batchnorm_running_stats_over_calls_then_eval(tmp_path):
    ref, new = _pair(tmp_path)
    with torch.no_grad():
        for step in range(3):  # training mode: batch statistics, running stats updated each call
            x = torch.randn(37, 70) * (step + 1)
            torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        for name in ("running_mean", "running_var"):
            torch.testing.assert_close(getattr(new.bn, name), getattr(ref.bn, name), atol=1e-5, rtol=1e-5)
        assert int(new.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == 3
        ref.eval()
        new.eval()
        x = torch.randn(5, 70)  # eval: running statistics, nothing updated, a batch of 1 is fine
        before = new.bn.running_mean.clone()
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(new(x[:1]), ref(x[:1]), atol=1e-4, rtol=1e-4)
        assert torch.equal(new.bn.running_mean, before)
        new.train()
        with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
            new(x[:1])
