"""The GEMM-anchored family through the whole pipeline, one test per op family, at odd sizes (37 x 70 -> 129:
rows and columns straddle the tiles, a row spans three column tiles in the interpreter), checked with the
accuracy contract; each asserts which regions kfuse made and what it left as torch calls."""

from __future__ import annotations

import pytest

from kfuse.errors import UnsupportedError
from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, optimize
from kfuse_testing import write_problem

CPU = Options(device="cpu", trials=2)
LINEAR = "self.lin = nn.Linear(in_features, out_features)"

# (id, extra __init__ lines, forward body after `y = self.lin(x)`, expected [(kind, ops)], expected unfused)
CASES = [
    # reductions over the features, keepdim or not, and the ops after them (finalize kernel)
    ("sum_keepdim", "", "return torch.sigmoid(y).sum(dim=1, keepdim=True) * 0.5",
     [("gemm_rowreduce", ["linear", "sigmoid", "sum", "mul"])], []),
    ("mean_gelu", "", "return F.gelu(torch.relu(y).mean(dim=-1))",
     [("gemm_rowreduce", ["linear", "relu", "mean", "gelu"])], []),
    ("max_values", "", "return torch.max(y * 2.0, dim=1).values - 1.0",
     [("gemm_rowreduce", ["linear", "mul", "amax", "view", "sub"])], []),
    ("max_getitem_keepdim", "", "return torch.tanh(torch.max(y, 1, keepdim=True)[0])",
     [("gemm_rowreduce", ["linear", "amax", "view", "tanh"])], []),
    ("min", "", "return torch.min(y, dim=1)[0]", [("gemm_rowreduce", ["linear", "amin", "view"])], []),
    ("amax", "", "return torch.amax(F.silu(y), dim=1, keepdim=True)",
     [("gemm_rowreduce", ["linear", "silu", "amax"])], []),
    ("logsumexp_scale", "", "return torch.logsumexp(y, dim=1, keepdim=True) * 2.0",
     [("gemm_rowreduce", ["linear", "logsumexp", "mul"])], []),
    ("logsumexp_mish", "",
     "z = torch.logsumexp(torch.clamp(y, -10.0, 10.0), dim=1, keepdim=True)\nreturn z * F.mish(z)",
     [("gemm_rowreduce", ["linear", "hardtanh", "logsumexp", "mish", "mul"])], []),
    # softmax: a row result, then an apply pass over the full width
    ("softmax", "", "return torch.softmax(F.gelu(y), dim=1) * 3.0",
     [("gemm_rowreduce", ["linear", "gelu", "softmax", "mul"])], []),
    ("softmax_module", "self.sm = nn.Softmax(dim=-1)", "return self.sm(y)",
     [("gemm_rowreduce", ["linear", "softmax"])], []),
    ("log_softmax", "", "return F.log_softmax(y, dim=1)", [("gemm_rowreduce", ["linear", "log_softmax"])], []),
    # a reduction read back at full width: the apply pass mixes per-row and full-width values
    ("centre_rows", "", "return torch.relu(y - y.mean(dim=1, keepdim=True))",
     [("gemm_rowreduce", ["linear", "mean", "sub", "relu"])], []),
    # norms over the whole row
    ("layernorm", "self.ln = nn.LayerNorm(out_features)", "return torch.relu(self.ln(y * 2.0))",
     [("gemm_rowreduce", ["linear", "mul", "layer_norm", "relu"])], []),
    ("layernorm_no_affine_gate", "self.ln = nn.LayerNorm(out_features, elementwise_affine=False)",
     "return y * torch.sigmoid(self.ln(y))", [("gemm_rowreduce", ["linear", "layer_norm", "sigmoid", "mul"])], []),
    ("layernorm_functional", "", "return F.layer_norm(y, (y.shape[-1],))", None, None),
    ("instancenorm_unsqueezed", "self.inorm = nn.InstanceNorm1d(1, affine=True)",
     "return self.inorm(y.unsqueeze(1)).squeeze(1) + y",
     [("gemm_rowreduce", ["linear", "view", "instance_norm", "view", "add"])], []),
    # the sum of a whole GEMM output: a GEMV (rewrite), and the size-1 reductions after it vanish
    ("gemv_sum_chain", "", "x = torch.sum(y, dim=1, keepdim=True)\nx = torch.max(x, dim=1, keepdim=True)[0]\n"
     "x = torch.mean(x, dim=1, keepdim=True)\nreturn torch.logsumexp(x, dim=1, keepdim=True)",
     [("gemm_rowsum", ["linear_rowsum", "view", "view", "view", "view"])], []),
    ("gemv_scaled_mean", "", "return torch.mean(y / 2.0, dim=1) * 1.5",
     [("gemm_rowsum", ["linear_rowsum", "mul"])], []),
    # the pointwise family with saved values
    ("saved_value_gate", "self.s = nn.Parameter(torch.randn(out_features))", "return y * torch.sigmoid(y * self.s) + y",
     [("gemm_epilogue", ["linear", "mul", "sigmoid", "mul", "add"])], []),
    ("min_with_param", "self.c = nn.Parameter(torch.tensor(0.3))", "return torch.min(y, self.c) - self.c",
     [("gemm_epilogue", ["linear", "clamp_max", "sub"])], []),
    ("clone_detach_residual", "", "z = y.clone().detach()\nreturn y * 0.5 + z",
     [("gemm_epilogue", ["linear", "identity", "view", "mul", "add"])], []),
    # 1-d pooling over the features, windows inside a column tile (N = 129: the last window is dropped)
    ("maxpool", "self.pool = nn.MaxPool1d(2)", "return self.pool(y.unsqueeze(1)).squeeze(1)",
     [("gemm_pool", ["linear", "view", "max_pool1d", "view"])], []),
    ("avgpool_gelu_scale", "self.pool = nn.AvgPool1d(kernel_size=4)",
     "return F.gelu(self.pool(y.unsqueeze(1)).squeeze(1)) * 2.0",
     [("gemm_pool", ["linear", "view", "avg_pool1d", "view", "gelu", "mul"])], []),
    ("maxpool_functional_3d", "", "return torch.relu(F.max_pool1d(torch.sigmoid(y).unsqueeze(1), 8))",
     [("gemm_pool", ["linear", "sigmoid", "view", "max_pool1d", "relu"])], []),
    # a reduction over the pooled features: two-phase; N = 129 with windows of 4 leaves the last column tile
    # without a whole window (an empty partial)
    ("maxpool_sum_scale", "self.pool = nn.MaxPool1d(2)",
     "return torch.sum(self.pool(y.unsqueeze(1)).squeeze(1), dim=1) * 0.5",
     [("gemm_pool", ["linear", "view", "max_pool1d", "view", "sum", "mul"])], []),
    ("avgpool_gelu_max", "self.pool = nn.AvgPool1d(4)",
     "z = F.gelu(self.pool(y.unsqueeze(1)).squeeze(1)) * 2.0\nreturn torch.max(z, dim=1).values",
     [("gemm_pool", ["linear", "view", "avg_pool1d", "view", "gelu", "mul", "amax", "view"])], []),
    ("avgpool_logsumexp", "", "return torch.logsumexp(F.avg_pool1d(y.unsqueeze(1), 4), dim=-1, keepdim=True) - 1.0",
     [("gemm_pool", ["linear", "view", "avg_pool1d", "logsumexp", "sub"])], []),
    # fallbacks: correct, and listed
    ("overlapping_pool_fallback", "self.pool = nn.AvgPool1d(3, stride=1)",
     "return self.pool(y.unsqueeze(1)).squeeze(1)", None, ["nn.AvgPool1d pool"]),
    ("dropout_training_fallback", "self.drop = nn.Dropout(0.0001)", "return torch.relu(self.drop(y))", None,
     ["nn.Dropout drop", "torch.relu"]),
    ("second_reduction_fallback", "", "return torch.logsumexp(y, dim=1), y.sum(dim=1)",
     [("gemm_rowreduce", ["linear", "logsumexp"]), ("torch", ["sum"])], ["Tensor.sum"]),
]


@pytest.mark.parametrize("name, init, body, regions, unfused", CASES, ids=[c[0] for c in CASES])
def test_family(tmp_path, name, init, body, regions, unfused):
    path = write_problem(tmp_path, f"{LINEAR}\n{init}", f"y = self.lin(x)\n{body}",
                         inputs="torch.randn(batch_size, in_features)")
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    got = [(r.kind, r.ops()) for r in result.compiled.regions]
    if regions is not None:
        assert got == regions
    if unfused is not None:
        views = ("Tensor.unsqueeze", "Tensor.squeeze")
        assert [u for u in result.compiled.unfused if not u.startswith(views)] == unfused
    assert got[0][0] != "torch"  # the GEMM itself is always fused


def test_groupnorm_wider_than_a_tile_is_fused_two_phase(tmp_path):
    """One group of 96 channels spans both 64-wide column tiles (the second one partial): two-phase
    (regions/gemm_groupnorm_wide.py; more cases in tests/test_groupnorm_wide.py)."""
    init = f"{LINEAR}\nself.gn = nn.GroupNorm(1, out_features)"
    path = write_problem(tmp_path, init, "return torch.relu(self.gn(self.lin(x)))", n=96)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [
        ("gemm_groupnorm_wide", ["linear", "group_norm", "relu"])]
    assert result.compiled.unfused == []


@pytest.mark.parametrize("groups, n", [(8, 72), (13, 65), (10, 70), (8, 24)])
def test_groupnorm_narrow_odd_groups_are_fused_two_phase(tmp_path, groups, n):
    """Groups of 9, 5, 7 and 3 channels: narrower than a tile and not a power of two, straddling the tile
    edges: phase 2 takes each group's moments from y (gemm_groupnorm_wide.NARROW_SLOTS)."""
    init = f"{LINEAR}\nself.gn = nn.GroupNorm({groups}, out_features)"
    path = write_problem(tmp_path, init, "return torch.relu(self.gn(self.lin(x)))", n=n)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [
        ("gemm_groupnorm_wide", ["linear", "group_norm", "relu"])]
    assert result.compiled.unfused == []


def test_groupnorm_affine_without_bias_trains(tmp_path):
    """nn.GroupNorm(..., bias=False): a weight and no bias (capture used to assume both with affine)."""
    from kfuse.gradients import gradient_contract
    from kfuse.optimize import load_module

    init = f"{LINEAR}\nself.gn = nn.GroupNorm(8, out_features, bias=False)"
    path = write_problem(tmp_path, init, "return torch.relu(self.gn(self.lin(x)))", n=128)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [
        ("gemm_groupnorm", ["linear", "group_norm", "relu"])]
    module = load_module(result.candidate_path)
    grads = gradient_contract(load_problem(path), module.ModelNew, device="cpu", draws=1)
    assert grads.correct, grads.failures


def test_batchnorm_eval_one_kernel(tmp_path):
    init = f"{LINEAR}\nself.bn = nn.BatchNorm1d(out_features)\nself.eval()"
    path = write_problem(tmp_path, init, "return torch.relu(self.bn(self.lin(x)))")
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["gemm_batchnorm"]


def test_mlp_and_kn_matmul(tmp_path):
    init = (f"{LINEAR}\nself.fc2 = nn.Linear(out_features, 33)\n"
            "self.w = nn.Parameter(torch.randn(33, 45) / 6.0)")
    path = write_problem(tmp_path, init,
                         "y = torch.relu(self.lin(x))\ny = F.gelu(self.fc2(y))\nreturn torch.tanh(y @ self.w)")
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [
        ("gemm_epilogue", ["linear", "relu"]), ("gemm_epilogue", ["linear", "gelu"]),
        ("gemm_epilogue", ["matmul", "tanh"])]


def test_matmul_against_weight_transpose_is_linear(tmp_path):
    init = "self.weight = nn.Parameter(torch.randn(out_features, in_features))"
    path = write_problem(tmp_path, init, "return torch.relu(torch.matmul(x, self.weight.T))")
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [("gemm_epilogue", ["linear", "relu"])]


def test_batch_of_one(tmp_path):
    path = write_problem(tmp_path, LINEAR,
                         "y = self.lin(x)\nreturn torch.softmax(y, dim=1) + y.amax(dim=1, keepdim=True)", batch=1)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures


def test_strict_names_the_unfused_op(tmp_path):
    init = f"{LINEAR}\nself.pool = nn.AvgPool1d(3)"  # a window that is not a power of two
    path = write_problem(tmp_path, init, "return self.pool(self.lin(x).unsqueeze(1)).squeeze(1)")
    with pytest.raises(UnsupportedError, match="nn.AvgPool1d pool"):
        compile_problem(load_problem(path), Options(device="cpu", strict=True))
