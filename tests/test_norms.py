"""GroupNorm and BatchNorm1d fused after the GEMM: torch's exact semantics, in the interpreter."""

from __future__ import annotations

import pytest
import torch

from kfuse.load import load_problem
from kfuse.optimize import Options, load_module, optimize
from kfuse_testing import write_problem

CPU = Options(device="cpu", trials=2)


@pytest.mark.parametrize("group", [4, 16, 64])
def test_groupnorm_group_sizes(tmp_path, group):
    n = 256
    init = ("self.lin = nn.Linear(in_features, out_features)\n"
            f"self.gn = nn.GroupNorm(out_features // {group}, out_features, eps=1e-5)")
    path = write_problem(tmp_path, init, "return torch.relu(self.gn(self.lin(x)) * 1.5)", n=n)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [
        ("gemm_groupnorm", ["linear", "group_norm", "mul", "relu"])]


def test_groupnorm_without_affine(tmp_path):
    init = "self.lin = nn.Linear(in_features, out_features)\nself.gn = nn.GroupNorm(8, out_features, affine=False)"
    path = write_problem(tmp_path, init, "return self.gn(self.lin(x))", n=64)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert result.compiled.regions[0].kind == "gemm_groupnorm"


def test_groupnorm_one_kernel_refuses_groups_it_cannot_tile(tmp_path):
    """A ModelNew built for 16-channel groups, whose GroupNorm is later given 256-channel groups (no 256-wide
    tile compiled on an H100) or a count that does not divide them, says so in one line instead of failing in the
    autotuner."""
    init = "self.lin = nn.Linear(in_features, out_features)\nself.gn = nn.GroupNorm(8, out_features)"
    path = write_problem(tmp_path, init, "return self.gn(self.lin(x))", n=128)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct and result.compiled.regions[0].kind == "gemm_groupnorm"
    module = load_module(result.candidate_path)
    x = torch.randn(5, 70)
    for groups in (2, 3):  # 256-channel groups; 512 channels do not divide into 3
        new = module.ModelNew(70, 512)
        new.gn.num_groups = groups
        with pytest.raises(ValueError, match="power-of-two groups of at most 128 channels"), torch.no_grad():
            new(x)


def test_modelnew_missing_a_parameter_it_was_generated_with_says_so(tmp_path):
    """A ModelNew generated for an affine GroupNorm whose GroupNorm has no weight at run time (built non-affine)
    raises one clear line, not an AttributeError from inside the launcher."""
    init = "self.lin = nn.Linear(in_features, out_features)\nself.gn = nn.GroupNorm(8, out_features)"
    path = write_problem(tmp_path, init, "return self.gn(self.lin(x))", n=128)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    new = load_module(result.candidate_path).ModelNew(70, 128)
    new.gn.weight = None  # what nn.GroupNorm(..., affine=False) holds
    with pytest.raises(ValueError, match="construct ModelNew with the arguments of the Model"), torch.no_grad():
        new(torch.randn(5, 70))


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
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [
        ("gemm_batchnorm", ["linear", "mul", "batch_norm", "relu"])]


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


# ---- eval mode: BatchNorm folded into the weights at call time (bn-eval-fold, regions/gemm_batchnorm.py) ----
FOLD_CASES = {  # name: (init, forward, the parameter the folded weight is cached on)
    "linear_scale": ("self.lin = nn.Linear(in_features, out_features)\n"
                     "self.s = nn.Parameter(torch.randn(out_features))\n"
                     "self.bn = nn.BatchNorm1d(out_features)", BN_FORWARD, "lin.weight"),
    "kn_no_affine": ("self.w = nn.Parameter(torch.randn(in_features, out_features) / 8)\n"
                     "self.bn = nn.BatchNorm1d(out_features, affine=False)",
                     "return torch.tanh(self.bn(x @ self.w))", "w"),
    "no_bias_gelu": ("self.lin = nn.Linear(in_features, out_features, bias=False)\n"
                     "self.bn = nn.BatchNorm1d(out_features)",
                     "return F.gelu(self.bn(self.lin(x)))", "lin.weight"),
}


def randomize_bn(model: torch.nn.Module, seed: int) -> None:
    """Running statistics and affine far from their defaults (mean 0, var 1, gamma 1, beta 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn = model.bn
        n = bn.num_features
        bn.running_mean.copy_(torch.randn(n, generator=g) * 3)
        bn.running_var.copy_(torch.rand(n, generator=g) * 4 + 0.05)
        if bn.affine:
            bn.weight.copy_(torch.randn(n, generator=g))
            bn.bias.copy_(torch.randn(n, generator=g))


def fold_pair(tmp_path, case: str):
    init, forward, _ = FOLD_CASES[case]
    prob = load_problem(write_problem(tmp_path, init, forward, name=case))
    result = optimize(prob, Options(device="cpu", trials=1), workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    module = load_module(result.candidate_path)
    torch.manual_seed(0)
    ref = prob.build()
    randomize_bn(ref, 1)
    ref.eval()
    new = prob.build(cls=module.ModelNew)
    new.load_state_dict(ref.state_dict())
    new.eval()
    return prob, ref, new, module


def folded_entry(new: torch.nn.Module, case: str):
    return getattr(new.get_parameter(FOLD_CASES[case][2]), "_kfuse_bn_fold", None)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


@pytest.mark.parametrize("case", sorted(FOLD_CASES))
def test_bn_eval_fold_meets_the_contract(tmp_path, case):
    """Eval mode with non-trivial running statistics, 37 x 70 -> 129: rules 2 and 3 against eager and float64,
    through the folded weights (the launcher cached them on the weight)."""
    import copy
    prob, ref, new, _ = fold_pair(tmp_path, case)
    f64 = copy.deepcopy(ref).double()
    with torch.no_grad():
        for draw in range(3):
            torch.manual_seed(50 + draw)
            x = prob.inputs()[0]
            got, want, exact = new(x), ref(x), f64(x.double())
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), max_err(got, want)
            assert max_err(got, exact) <= 2 * max_err(want, exact) + 1e-7, (max_err(got, exact), max_err(want, exact))
    assert folded_entry(new, case) is not None


def test_bn_fold_follows_train_eval_switch(tmp_path):
    """eval (fold cached) -> train (batch statistics; the kernel updates the running statistics) -> eval: the
    second eval call uses the new running statistics, as torch does."""
    prob, ref, new, _ = fold_pair(tmp_path, "linear_scale")
    torch.manual_seed(7)
    x = prob.inputs()[0]
    with torch.no_grad():
        first = new(x)
        torch.testing.assert_close(first, ref(x), atol=1e-4, rtol=1e-4)
        for m in (ref, new):
            m.train()
        for step in range(2):
            xt = torch.randn(37, 70) * (step + 2) + 1
            torch.testing.assert_close(new(xt), ref(xt), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(new.bn.running_var, ref.bn.running_var, atol=1e-5, rtol=1e-5)
        for m in (ref, new):
            m.eval()
        again = new(x)
        torch.testing.assert_close(again, ref(x), atol=1e-4, rtol=1e-4)
        assert max_err(again, first) > 1e-2  # the statistics did move: a stale fold would fail the line above


def test_bn_fold_cache_follows_every_input(tmp_path, monkeypatch):
    """Recomputed when running_var changes in place, on load_state_dict, on an eps or scale change; reused
    (same tensors, no recompute) otherwise."""
    prob, ref, new, module = fold_pair(tmp_path, "linear_scale")
    calls = []
    real = module.batch_norm_fold
    monkeypatch.setattr(module, "batch_norm_fold", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(8)
    x = prob.inputs()[0]

    def check(expected_calls: int) -> torch.Tensor:
        with torch.no_grad():
            got = new(x)
            torch.testing.assert_close(got, ref(x), atol=1e-4, rtol=1e-4)
        assert len(calls) == expected_calls
        return got

    out0 = check(1)
    cached = folded_entry(new, "linear_scale")[1]
    assert torch.equal(check(1), out0) and folded_entry(new, "linear_scale")[1] is cached
    with torch.no_grad():
        for m in (ref, new):
            m.bn.running_var.mul_(4.0)
    assert max_err(check(2), out0) > 1e-3
    other = prob.build()
    randomize_bn(other, 2)
    for m in (ref, new):
        m.load_state_dict(other.state_dict())
    out3 = check(3)
    for m in (ref, new):
        m.bn.eps = 0.5
    check(4)
    with torch.no_grad():
        for m in (ref, new):
            m.s.mul_(-2.0)
    assert max_err(check(5), out3) > 1e-3
    check(5)


def test_bn_fold_under_inference_mode(tmp_path):
    """Folded under inference_mode, reused outside it (the cache holds ordinary tensors)."""
    prob, ref, new, _ = fold_pair(tmp_path, "linear_scale")
    x = prob.inputs()[0]
    with torch.inference_mode():
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows, cols, tile_m", [(37 * 5 + 3, 70, 37), (300 * 16 + 5, 129, 16)])
def test_batch_norm_stats_merges_tiles_like_torch(rows, cols, tile_m):
    """The finalize kernel on fp32 tile partials: odd sizes, a short last tile, more tiles than one load
    (BLOCK_T = 128) in the second case, values on a large offset (1e4 + N(0, 1): a naive E[y^2] - E[y]^2 in fp32
    would lose the variance). Against the same merge in float64 (what the kernel promises: its own rounding only
    at the end), and against torch on y itself to the partials' fp32 rounding; running statistics as torch's
    BatchNorm1d updates them."""
    from kfuse.kernels.batchnorm import batch_norm_stats

    g = torch.Generator().manual_seed(3)
    y = 1e4 + torch.randn(rows, cols, generator=g, dtype=torch.float64)
    tiles = y.split(tile_m)
    mean_part = torch.stack([t.mean(0) for t in tiles]).float()
    m2_part = torch.stack([((t - t.mean(0)) ** 2).sum(0) for t in tiles]).float()
    counts = torch.tensor([len(t) for t in tiles], dtype=torch.float64)[:, None]
    merged_mean = (counts * mean_part.double()).sum(0) / rows
    merged_m2 = (m2_part.double() + counts * (mean_part.double() - merged_mean) ** 2).sum(0)
    bn = torch.nn.BatchNorm1d(cols, eps=1e-3, momentum=0.3)
    ref = torch.nn.BatchNorm1d(cols, eps=1e-3, momentum=0.3).double()
    mean, rstd = batch_norm_stats(mean_part, m2_part, rows, tile_m, bn, 0.3)
    ref(y)
    torch.testing.assert_close(mean.double(), merged_mean, rtol=1e-7, atol=0)
    torch.testing.assert_close(rstd.double(), (merged_m2 / rows + 1e-3).rsqrt(), rtol=1e-7, atol=0)
    torch.testing.assert_close(bn.running_mean.double(), 0.7 * 0 + 0.3 * merged_mean, rtol=1e-7, atol=0)
    torch.testing.assert_close(bn.running_var.double(), 0.7 + 0.3 * merged_m2 / (rows - 1), rtol=1e-7, atol=0)
    # torch on y: the partials' fp32 rounding (1e4's ulp) is all that differs
    torch.testing.assert_close(mean.double(), y.mean(0), rtol=1e-7, atol=0)
    torch.testing.assert_close(rstd.double(), (y.var(0, unbiased=False) + 1e-3).rsqrt(), rtol=1e-4, atol=0)
    torch.testing.assert_close(bn.running_var.double(), ref.running_var, rtol=1e-4, atol=0)
