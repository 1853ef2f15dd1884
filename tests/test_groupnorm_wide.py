"""GroupNorm whose groups do not fit a column tile (kind `gemm_groupnorm_wide`, regions/gemm_groupnorm_wide.py):
per-tile partial moments, a per-(row, group) Chan merge, an apply pass. In the interpreter the column tile is
64 wide, so groups of 384 span six tiles, groups of 100 or 43 straddle tile edges, and N = 300 or 258 leaves a
partial last tile. Each case is checked with the accuracy contract against eager."""

from __future__ import annotations

import copy
import textwrap

import pytest
import torch

from kfuse.kernels.runtime import group_slots
from kfuse.load import load_problem
from kfuse.optimize import Options, load_module, optimize
from kfuse_testing import ROOT, requires_cuda, write_problem

CPU = Options(device="cpu", trials=2)
LINEAR = "self.lin = nn.Linear(in_features, out_features)"

# (id, N, __init__ lines after the Linear, forward body after `y = self.lin(x)`, expected ops of the region)
CASES = [
    # 2 groups of 384: each group spans six 64-wide column tiles (one partial slot per tile)
    ("span_six_tiles", 768, "self.gn = nn.GroupNorm(2, out_features)", "return torch.relu(self.gn(y))",
     ["linear", "group_norm", "relu"]),
    # 3 groups of 100: tiles 1 and 3 each hold the end of one group and the start of the next; N = 300 leaves a
    # 44-column last tile; a pre value read after the norm, pointwise ops before and after
    ("straddle_pre_and_post", 300, "self.gn = nn.GroupNorm(3, out_features, eps=1e-3)",
     "z = y * 1.5\nreturn F.hardtanh(self.gn(z), -2.0, 2.0) + z * 0.1",
     ["linear", "mul", "group_norm", "hardtanh", "mul", "add"]),
    # 6 groups of 43 without affine: up to three groups meet in one tile, groups that are not a power of two
    ("non_affine_43", 258, "self.gn = nn.GroupNorm(6, out_features, affine=False)",
     "return torch.sigmoid(self.gn(F.silu(y)))", ["linear", "silu", "group_norm", "sigmoid"]),
    # the functional spelling with a literal group count and per-channel parameters
    ("functional", 192,
     "self.w = nn.Parameter(torch.randn(out_features))\nself.b = nn.Parameter(torch.randn(out_features))",
     "return F.group_norm(y, 2, self.w, self.b) * 2.0", ["linear", "group_norm", "mul"]),
    # the norm's input is also a model output (stored by phase 1 in the output's dtype)
    ("two_outputs", 170, "self.gn = nn.GroupNorm(5, out_features)", "z = y - 0.5\nreturn z, F.gelu(self.gn(z))",
     ["linear", "sub", "group_norm", "gelu"]),
    # groups narrower than a third of a tile (9 and 3 channels, straddling tile edges): no partials, phase 2
    # reads each group's columns of y; the affine parameters perturbed so they are checked
    ("narrow_9", 261,
     "self.gn = nn.GroupNorm(29, out_features)\nnn.init.normal_(self.gn.weight)\nnn.init.normal_(self.gn.bias)",
     "return torch.tanh(self.gn(y))", ["linear", "group_norm", "tanh"]),
    ("narrow_3_two_outputs", 129, "self.gn = nn.GroupNorm(43, out_features)", "z = y * 2.0\nreturn z, self.gn(z) - 1.0",
     ["linear", "mul", "group_norm", "sub"]),
]


@pytest.mark.parametrize("name, n, init, body, ops", CASES, ids=[c[0] for c in CASES])
def test_wide_groupnorm_meets_contract(tmp_path, name, n, init, body, ops):
    path = write_problem(tmp_path, f"{LINEAR}\n{init}", f"y = self.lin(x)\n{body}", n=n,
                         inputs="torch.randn(batch_size, in_features)")
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [("gemm_groupnorm_wide", ops)]
    assert result.compiled.unfused == []


@pytest.mark.parametrize("stem", ["08_gemm_groupnorm_hardtanh", "09_matmul_swish_biasadd_groupnorm"])
def test_problems_with_512_channel_groups(tmp_path, stem):
    """The problems' own group size: 16 groups of 512 over 8192 features (each group spans 8 column tiles)."""
    prob = load_problem(ROOT / "problems" / "gemm" / f"{stem}.py", {"batch_size": 5, "in_features": 16})
    result = optimize(prob, Options(device="cpu", trials=1), workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["gemm_groupnorm_wide"]
    assert result.compiled.unfused == []


SIZED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features, num_groups, affine):
        super().__init__()
        self.lin = nn.Linear(in_features, out_features)
        self.gn = nn.GroupNorm(num_groups, out_features, affine=affine)

    def forward(self, x):
        return torch.tanh(self.gn(self.lin(x) * 0.5))


batch_size = 37
in_features = 70
out_features = 300
num_groups = 3


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups, True]
'''


def test_model_new_built_at_other_sizes(tmp_path):
    """A ModelNew made for 3 groups of 100 reads the group count from its module: constructed with other
    sizes (groups spanning tiles, straddling them, narrower than a tile, one group) it still meets rules 2
    and 3; a group count that does not divide the channels raises a clear error."""
    path = tmp_path / "sized.py"
    path.write_text(textwrap.dedent(SIZED))
    result = optimize(load_problem(path), Options(device="cpu", trials=1), workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["gemm_groupnorm_wide"]
    module = load_module(result.candidate_path)
    for n, groups, batch in [(512, 2, 9), (96, 2, 40), (520, 4, 3), (64, 4, 11), (200, 1, 5)]:
        torch.manual_seed(n + groups)
        ref = module.Model(70, n, groups, True)
        with torch.no_grad():  # not the default ones and zeros, so the affine is checked
            ref.gn.weight.normal_()
            ref.gn.bias.normal_()
        new = module.ModelNew(70, n, groups, True)
        new.load_state_dict(ref.state_dict(), strict=True)
        f64 = copy.deepcopy(ref).double()
        x = torch.randn(batch, 70)
        with torch.no_grad():
            want, got, exact = ref(x), new(x), f64(x.double())
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        ref_err = (want.double() - exact).abs().max().item()
        assert (got.double() - exact).abs().max().item() <= 2 * ref_err + 1e-7, (n, groups)
    new.gn.num_groups = 3  # 200 channels in 3 groups: torch would refuse it too
    with pytest.raises(ValueError, match="200 channels are not divisible into 3 groups"):
        with torch.no_grad():
            new(x)


@pytest.mark.parametrize("block_n", [16, 32, 64, 128, 256])
def test_group_slots_bounds_the_groups_a_tile_touches(block_n):
    """group_slots is what phase 1 allocates per tile: never fewer than the groups a tile really touches."""
    for group in range(1, 400):
        n = group * max(12, -(-3 * block_n // group))  # whole groups, at least three tiles
        touched = max(len({c // group for c in range(t, min(t + block_n, n))}) for t in range(0, n, block_n))
        assert touched <= group_slots(block_n, group), (block_n, group)
        if group % block_n == 0 or block_n % group == 0:
            assert touched == group_slots(block_n, group)  # exact where tiles and groups align


# ---- compiled on a GPU (`TRITON_INTERPRET=0 pytest -m gpu`; skipped without CUDA) ---------------------------
@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("name, n, init, body, ops", CASES, ids=[c[0] for c in CASES])
def test_wide_groupnorm_compiled_on_gpu(tmp_path, name, n, init, body, ops):
    """The same odd sizes compiled: the GPU's column tiles (64 to 256) against groups of 384, 100, 43, 96, 34, 9, 3."""
    path = write_problem(tmp_path, f"{LINEAR}\n{init}", f"y = self.lin(x)\n{body}", n=n,
                         inputs="torch.randn(batch_size, in_features)")
    result = optimize(load_problem(path), Options(device="cuda", trials=2), workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [("gemm_groupnorm_wide", ops)]


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("stem", ["08_gemm_groupnorm_hardtanh", "09_matmul_swish_biasadd_groupnorm"])
def test_problems_full_size_on_gpu(tmp_path, stem):
    """1024 x 8192 -> 8192, 16 groups of 512: correct, and faster than eager."""
    prob = load_problem(ROOT / "problems" / "gemm" / f"{stem}.py")
    result = optimize(prob, Options(device="cuda", trials=5), workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["gemm_groupnorm_wide"]
    assert result.timings_ms["kfuse"] < result.timings_ms["eager"], result.timings_ms
