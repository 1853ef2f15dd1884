"""`--backend cuda`'s norm region kinds (kfuse/cuda/norms.py, norm_source.py): GEMM -> ops -> GroupNorm or
BatchNorm1d -> ops as the GEMM with the pre-norm functor, then the norm's CUDA pass with the post-norm functor.

Without a GPU: the partition fuses each case whole in the registry's norm kinds, the emitted file is complete,
the CUDA source compiles with nvcc (where installed) without spills, and autograd through the generated Function
meets the gradient contract with torch in place of the kernels (running statistics included). With a GPU: every
case meets the accuracy contract (outputs and the BatchNorm's buffers), and the gradient contract.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess

import pytest

from kfuse.cuda.norms import norm_plan
from kfuse.cuda.regions import KINDS
from kfuse.load import load_problem
from kfuse.modes import variants
from kfuse.optimize import capture_problem, load_module
from kfuse_testing import requires_cuda, write_problem
from test_cuda_backend import EVERY_KIND, NVCC_FLAGS, _contract, _torch_launch, check_emitted, compile_cuda, region_fns

# name -> (init, forward, sizes): group sizes 16, 24, 500 and 1024 (the register kernel with 1, 2, 4 and 8 float4s
# per lane), 43 and 129 (the scalar kernel; one group per row), 24 with the GEMM's value read again after the norm;
# BatchNorm training (momentum and cumulative), eval with running statistics, and without running statistics or
# affine
CASES = {
    "gn16_leaky_sum": ("self.fc = nn.Linear(in_features, out_features)\nself.gn = nn.GroupNorm(8, out_features)",
                       "x = F.leaky_relu(self.gn(self.fc(x)), 0.01)\nreturn x + x", {"n": 128}),
    "gn43_scale_tanh": ("self.fc = nn.Linear(in_features, out_features)\nself.gn = nn.GroupNorm(3, out_features)\n"
                        "self.s = nn.Parameter(torch.randn(out_features))",
                        "return torch.tanh(self.gn(self.fc(x) * self.s))", {"n": 129}),
    "gn_one_group_plain": ("self.fc = nn.Linear(in_features, out_features)\n"
                           "self.gn = nn.GroupNorm(1, out_features, affine=False)",
                           "return torch.relu(self.gn(self.fc(x)))", {"n": 129}),
    "gn500_two_groups": ("self.fc = nn.Linear(in_features, out_features)\nself.gn = nn.GroupNorm(2, out_features)",
                         "return self.gn(self.fc(x))", {"n": 1000}),
    "gn1024_mish": ("self.fc = nn.Linear(in_features, out_features)\nself.gn = nn.GroupNorm(2, out_features)",
                    "return F.mish(self.gn(self.fc(x)))", {"n": 2048, "batch": 19}),
    "gn24_residual_two_outputs": ("self.fc = nn.Linear(in_features, out_features)\n"
                                  "self.gn = nn.GroupNorm(4, out_features)",
                                  "y = torch.sigmoid(self.fc(x))\nreturn self.gn(y) + y, y", {"n": 96}),
    "bn_train_relu": ("self.fc = nn.Linear(in_features, out_features)\nself.bn = nn.BatchNorm1d(out_features)\n"
                      "self.s = nn.Parameter(torch.randn(out_features))",
                      "return torch.relu(self.bn(self.fc(x) * self.s))", {}),
    "bn_cumulative": ("self.fc = nn.Linear(in_features, out_features)\n"
                      "self.bn = nn.BatchNorm1d(out_features, momentum=None)",
                      "return self.bn(self.fc(x)) * 2.0", {"batch": 300, "n": 40}),
    "bn_eval_running": ("self.fc = nn.Linear(in_features, out_features)\nself.bn = nn.BatchNorm1d(out_features)\n"
                        "self.bn.eval()\nwith torch.no_grad():\n    self.bn.running_mean.uniform_(-1, 1)\n"
                        "    self.bn.running_var.uniform_(0.5, 2)",
                        "return F.gelu(self.bn(self.fc(x)))", {}),
    "bn_no_stats_no_affine": ("self.fc = nn.Linear(in_features, out_features)\n"
                              "self.bn = nn.BatchNorm1d(out_features, affine=False, track_running_stats=False)",
                              "return self.bn(self.fc(x))", {"batch": 17}),
}


def _problem(tmp_path, name):
    init, forward, sizes = CASES[name]
    return write_problem(tmp_path, init, forward, name=name, **sizes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_partition_fuses_the_norm_region_whole(tmp_path, name):
    (v,) = variants(capture_problem(load_problem(_problem(tmp_path, name)), "cpu"), KINDS)
    assert not v.unfused, v.unfused
    (r,) = [r for r in v.regions if r.fused]
    assert r.kind.startswith("gemm_" + ("groupnorm" if name.startswith("gn") else "batchnorm")), r.kind
    plan = norm_plan(r)
    assert plan.stored[0] == plan.norm.args[0]  # u first: the norm's pass reads it
    assert set(plan.saved) <= set(plan.stored) and set(plan.late) | set(plan.stored) >= set(r.outputs)


def test_values_read_after_the_norm_are_stored_by_the_gemm(tmp_path):
    (v,) = variants(capture_problem(load_problem(_problem(tmp_path, "gn24_residual_two_outputs")), "cpu"), KINDS)
    (r,) = [r for r in v.regions if r.fused]
    plan = norm_plan(r)
    assert len(plan.saved) == 1 and plan.saved[0] == plan.stored[0]  # y: the norm's input, read again after it
    assert len(r.outputs) == 2 and plan.stored == (plan.saved[0],) and plan.late == (r.outputs[1],)


@pytest.mark.parametrize("name", sorted(CASES))
def test_emitted_file_is_complete(tmp_path, name):
    compiled = compile_cuda(_problem(tmp_path, name))
    assert compiled.fallback is None and compiled.backend == "cuda"
    check_emitted(compiled.source)
    cu = ast.literal_eval(re.search(r"CUDA_SRC = (r\'\'\'.*?\'\'\')", compiled.source, re.S).group(1))
    assert re.search(r"^struct Pre_\w+ \{", cu, re.M) and re.search(r"^struct Post_\w+ \{", cu, re.M)
    assert ("kf_group_norm(" if name.startswith("gn") else "kf_batch_norm(") in cu


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_every_kind_compiles_without_spills(tmp_path):
    """A BatchNorm, a GroupNorm, a row-sum, a row norm, a pool and an epilogue region in one translation unit, for
    H100."""
    src = compile_cuda(write_problem(tmp_path, *EVERY_KIND, name="every_kind")).source
    (tmp_path / "k.cu").write_text(ast.literal_eval(re.search(r"CUDA_SRC = (r\'\'\'.*?\'\'\')", src, re.S).group(1)))
    r = subprocess.run(["nvcc", "-c", "k.cu", "-o", "k.o", "-std=c++20", *NVCC_FLAGS,
                        "-gencode=arch=compute_90,code=sm_90", "-Xptxas", "-v"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    entries = re.findall(r"Compiling entry function '(\w+)'", r.stderr)
    for kernel in ("kf_group_norm_kernel", "kf_group_norm_vec_kernel", "kf_bn_apply_kernel", "kf_col_stats_kernel",
                   "kf_bn_finalize_kernel", "kf_row_dot_kernel", "kf_row_stats_kernel", "kf_pool_kernel"):
        assert any(kernel in e for e in entries), (kernel, entries)
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert spills and set(spills) == {"0"}, r.stderr[-4000:]


@pytest.mark.parametrize("name", ["gn24_residual_two_outputs", "gn43_scale_tanh", "bn_train_relu", "bn_cumulative",
                                  "bn_eval_running"])
def test_backward_meets_the_gradient_contract_with_torch_in_place_of_the_kernels(tmp_path, monkeypatch, name):
    from kfuse.gradients import gradient_contract

    path = _problem(tmp_path, name)
    prob = load_problem(path)
    out = tmp_path / "new.py"
    out.write_text(compile_cuda(path).source)
    module = load_module(out)
    (fn,) = region_fns(module, "CudaGemmFn")
    monkeypatch.setattr(fn, "launch", _torch_launch(module, fn))
    verdict = gradient_contract(prob, module.ModelNew, device="cpu", draws=2)
    assert verdict.correct, verdict.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_norm_regions_meet_the_contract(tmp_path, name):
    _, _, contract = _contract(_problem(tmp_path, name), {})
    assert contract.correct, contract.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ["gn24_residual_two_outputs", "bn_train_relu", "bn_eval_running"])
def test_gpu_norm_gradients_meet_the_contract(tmp_path, name):
    from kfuse.gradients import gradient_contract

    prob, module, _ = _contract(_problem(tmp_path, name), {}, trials=1)
    verdict = gradient_contract(prob, module.ModelNew, device="cuda", draws=2)
    assert verdict.correct, verdict.failures


@pytest.mark.gpu
@requires_cuda
def test_gpu_every_kind_meets_the_contract_and_the_gradient_contract(tmp_path):
    from kfuse.gradients import gradient_contract

    prob, module, contract = _contract(write_problem(tmp_path, *EVERY_KIND, name="every_kind"), {})
    assert contract.correct, contract.failures
    verdict = gradient_contract(prob, module.ModelNew, device="cuda", draws=2)
    assert verdict.correct, verdict.failures
