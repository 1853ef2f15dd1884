"""`--backend cuda`'s row kinds (rows_source.py's kernels): the row reduction kind (kfuse/cuda/rowreduce.py: a
reduction (sum, mean, amax, amin, logsumexp) or row norm (softmax, log_softmax, LayerNorm, InstanceNorm) over the
GEMM's features, with the ops before and after it) and the pool kind (kfuse/cuda/pool.py: MaxPool1d / AvgPool1d over
the features, the ops after it, a reduction of the pooled row).

Without a GPU: every problems/gemm file with such an op fuses it as the Triton backend does, the emitted files are
complete, the CUDA source of a Model with every statistic and
of the pool problems compiles with nvcc without spills, autograd through the generated Function meets the gradient
contract with torch in place of the kernels. With a GPU: the Model and every such problems/gemm file meet the
accuracy contract, and the gradient contract.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess

import pytest

from kfuse.cuda.regions import KINDS
from kfuse.cuda.rowreduce import row_plan
from kfuse.load import load_problem
from kfuse.modes import variants
from kfuse.optimize import capture_problem, load_module
from kfuse_testing import requires_cuda, write_problem
from test_cuda_backend import (
    GEMM,
    NVCC_FLAGS,
    _both_contracts,
    _contract,
    _torch_launch,
    check_emitted,
    compile_cuda,
    region_fns,
)

# problems/gemm files whose reduction or row norm the kind fuses
ROW_PROBLEMS = ["06_matmul_scale_residual_clamp_logsumexp_mish", "15_matmul_sigmoid_sum",
                "18_gemm_logsumexp_leakyrelu_gelu", "23_gemm_max_subtract_gelu", "32_matmul_gelu_softmax",
                "33_gemm_layernorm_relu_odd", "34_gemm_instancenorm_residual", "39_gemm_log_softmax_min",
                "40_gemm_mean_gelu_odd", "42_gemm_layernorm_sigmoid_gate"]
# one Model with every statistic: logsumexp (softmax), moments (LayerNorm), max with a post op reading the GEMM's
# value and the row's max, and a float64 sum
EVERY_STAT = ("self.fc1 = nn.Linear(in_features, out_features)\nself.fc2 = nn.Linear(out_features, out_features)\n"
              "self.ln = nn.LayerNorm(out_features)\nself.fc3 = nn.Linear(out_features, out_features)\n"
              "self.fc4 = nn.Linear(out_features, out_features)",
              "a = torch.softmax(self.fc1(x), dim=1)\nb = torch.relu(self.ln(self.fc2(a)))\nc = self.fc3(b)\n"
              "return c - c.amax(dim=1, keepdim=True), torch.sigmoid(self.fc4(b)).sum(dim=1) * 0.5")


POOL_PROBLEMS = ["14_matmul_maxpool_sum_scale", "31_matmul_avgpool_gelu_scale_max"]


@pytest.mark.parametrize("name", ROW_PROBLEMS + POOL_PROBLEMS)
def test_the_row_op_is_fused_and_the_file_complete(name):
    compiled = compile_cuda(GEMM / f"{name}.py")
    (v,) = compiled.variants
    (triton,) = variants(capture_problem(load_problem(GEMM / f"{name}.py", {}), "cpu"))
    assert [r.kind for r in v.regions if r.fused] == ["gemm_pool" if name in POOL_PROBLEMS else "gemm_rowreduce"]
    assert v.unfused == triton.unfused  # what the Triton backend leaves too (39: a second reduction, amin)
    check_emitted(compiled.source)


def test_every_stat_model_plans(tmp_path):
    prob = load_problem(write_problem(tmp_path, *EVERY_STAT, name="every_stat"))
    (v,) = variants(capture_problem(prob, "cpu"), KINDS)
    rows = [r for r in v.regions if r.kind == "gemm_rowreduce"]
    assert len(rows) == 4 and not v.unfused
    plans = {row_plan(r, v.graph).red.op: row_plan(r, v.graph) for r in rows}
    assert set(plans) == {"softmax", "layer_norm", "amax", "sum"}
    amax = plans["amax"]  # c - c.amax(...): the post op reads the GEMM's value (y) and the row's max
    assert amax.row_read == (amax.red.name,) and amax.late and not amax.saved
    assert plans["sum"].rows and not plans["sum"].post  # a per-row output only: no apply pass


def _nvcc_entries(cu: str, folder) -> list[str]:
    """nvcc's compiled kernels of `cu` for H100 (asserting it builds without spills)."""
    (folder / "k.cu").write_text(cu)
    r = subprocess.run(["nvcc", "-c", "k.cu", "-o", "k.o", "-std=c++20", *NVCC_FLAGS,
                        "-gencode=arch=compute_90,code=sm_90", "-Xptxas", "-v"], cwd=folder,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert spills and set(spills) == {"0"}, r.stderr[-4000:]
    return re.findall(r"Compiling entry function '(\w+)'", r.stderr)


def _cuda_src(source: str) -> str:
    return ast.literal_eval(re.search(r"CUDA_SRC = (r\'\'\'.*?\'\'\')", source, re.S).group(1))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_every_stat_compiles_without_spills(tmp_path):
    entries = _nvcc_entries(_cuda_src(compile_cuda(write_problem(tmp_path, *EVERY_STAT, name="every_stat")).source),
                            tmp_path)
    for stat in (0, 1, 3, 4):  # sum, max, logsumexp, moments; no min in this Model, so not compiled
        assert any(f"kf_row_stats_kernelILi{stat}E" in e for e in entries), (stat, entries)
    assert not any("kf_row_stats_kernelILi2E" in e for e in entries)
    assert any("kf_rows_apply_kernel" in e for e in entries) and any("kf_rows_kernel" in e for e in entries)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_pool_compiles_without_spills(tmp_path):
    """problems/gemm/31 (average pool, then a max of the pooled row) for H100."""
    entries = _nvcc_entries(_cuda_src(compile_cuda(GEMM / "31_matmul_avgpool_gelu_scale_max.py").source), tmp_path)
    assert any("kf_pool_kernelILb0E" in e for e in entries) and any("kf_row_stats_kernelILi1E" in e for e in entries)


@pytest.mark.parametrize("name", ["every_stat", "33_gemm_layernorm_relu_odd", "34_gemm_instancenorm_residual",
                                  "06_matmul_scale_residual_clamp_logsumexp_mish", *POOL_PROBLEMS])
def test_backward_meets_the_gradient_contract_with_torch_in_place_of_the_kernels(tmp_path, monkeypatch, name):
    from kfuse.gradients import gradient_contract

    sizes = {"batch_size": 37, "in_features": 70, "out_features": 129}
    path = write_problem(tmp_path, *EVERY_STAT, name=name) if name == "every_stat" else GEMM / f"{name}.py"
    prob = load_problem(path, {} if name == "every_stat" else sizes)
    out = tmp_path / "new.py"
    out.write_text(compile_cuda(path, {} if name == "every_stat" else sizes).source)
    module = load_module(out)
    fns = region_fns(module, "CudaGemmFn")
    assert fns
    for fn in fns:
        monkeypatch.setattr(fn, "launch", _torch_launch(module, fn))
    verdict = gradient_contract(prob, module.ModelNew, device="cpu", draws=2)
    assert verdict.correct, verdict.failures


@pytest.mark.gpu
@requires_cuda
def test_gpu_every_stat_meets_the_contract_and_the_gradient_contract(tmp_path):
    _both_contracts(write_problem(tmp_path, *EVERY_STAT, name="every_stat"))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ROW_PROBLEMS + POOL_PROBLEMS)
def test_gpu_row_problems_meet_the_contract(name):
    _, _, contract = _contract(GEMM / f"{name}.py", {})
    assert contract.correct, contract.failures
