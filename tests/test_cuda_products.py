"""Products of two values under `--backend cuda` (on unless KFUSE_CUDA_PRODUCTS=0): `x @ y` with y a 2-d
value (KernelBench's level-1 matmuls, `fc(x) @ x.t()`) or a batch of products (bmm, x[..., M, K] @ y[..., K, N]) is a
fused region, y split on every call; the other kinds do not take its walk over; the autograd Function's backward
(kfuse/cuda/runtime.py CudaProductFn) against torch's."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from kfuse.cuda import runtime
from kfuse.cuda.regions import KINDS, PRODUCTS_SWITCH, unfused_reasons
from kfuse.kernels.gemm_core import LONG_K
from kfuse.load import load_problem
from kfuse.modes import variants
from kfuse.optimize import capture_problem
from kfuse_testing import ROOT, requires_cuda, write_problem
from test_cuda_backend import (
    NVCC_FLAGS,
    TWO_VALUES,
    _both_contracts,
    _contract,
    check_emitted,
    compile_cuda,
    cpp_syntax_errors,
    emitted_constants,
)

# KernelBench's level-1 files: $KB1 (gpu_sm90.sh passes its own), else beside this checkout
KB1 = Path(os.environ.get("KB1") or ROOT.parent / "shared" / "kernelbench" / "level1")
# the level-1 products of two 2-d values (or a 3-d value @ a 2-d one), each a different arrangement of operands
# (small sizes: the CPU only compiles them)
LEVEL1 = {"1_Square_matrix_multiplication_": {"N": 70}, "10_3D_tensor_matrix_multiplication": {"N": 3, "M": 37, "K": 70,
                                                                                             "L": 129},
          "16_Matmul_with_transposed_A": {"M": 37, "K": 70, "N": 129},
          "3_Batched_matrix_multiplication": {"batch_size": 3, "m": 37, "k": 70, "n": 129},
          "18_Matmul_with_transposed_both": {"M": 37, "K": 70, "N": 129}}
# batches of products: bmm of a Linear's output with its transpose, and x @ x^T over two leading dims with an epilogue
BATCHED = ("self.fc = nn.Linear(in_features, in_features)",
           "h = self.fc(x).view(1, x.shape[0], -1)\nreturn torch.relu(torch.bmm(h, h.transpose(1, 2)))")
FOUR_D = ("", "return torch.sigmoid(torch.matmul(x, x.transpose(-1, -2)) * 0.5 + 1.0)")
FOUR_D_INPUTS = "torch.rand(2, 3, batch_size, in_features)"
# (batch, M, K, N) of one bmm for each kernel: the GEMV (M <= SKINNY_M), the CUDA-core tile (few multiply-adds) and
# the split tensor-core tile, every edge odd
BMM_SIZES = {"gemv": (3, 5, 70, 129), "cuda_core": (3, 37, 70, 129), "tensor_core": (3, 300, 700, 501)}
# x (B, M + N, K) -> x[:, :M] @ x[:, M:]^T, then an epilogue (batch_size = M + N, out_features = M)
BMM = ("", "return torch.bmm(x[:, :out_features], x[:, out_features:].transpose(1, 2)) * 2.0 - 0.5")
PRODUCT_NORM = ("self.fc = nn.Linear(in_features, in_features)\nself.gn = nn.GroupNorm(3, batch_size)",
                "return self.gn(torch.matmul(self.fc(x), x.t()))")


@pytest.fixture
def products(monkeypatch):
    monkeypatch.setenv(PRODUCTS_SWITCH, "1")


def kinds_and_unfused(path: Path) -> tuple[list[str], list[str]]:
    (v,) = variants(capture_problem(load_problem(path, {}), "cpu"), KINDS)
    return [r.kind for r in v.regions if r.fused], list(v.unfused)


def test_two_values_fused_with_the_op_after_them(tmp_path, products):
    path = write_problem(tmp_path, *TWO_VALUES, name="two_values")
    assert kinds_and_unfused(path) == (["gemm_epilogue", "gemm_epilogue"], [])
    source = compile_cuda(path).source
    check_emitted(source)
    assert re.search(r"^class MatmulReluFn\(CudaProductFn\):", source, flags=re.M)
    assert "relu = MatmulReluFn.run(self, fc, t)" in source  # x and y, as the forward has them
    assert "gemm_operands(ext, x2, y, True, GEMM_SCHEME, cached=False)" in source


def _batched(tmp_path: Path, which: str) -> Path:
    if which == "bmm_fc":
        return write_problem(tmp_path, *BATCHED, name="batched")
    return write_problem(tmp_path, *FOUR_D, inputs=FOUR_D_INPUTS, name="four_d")


@pytest.mark.parametrize("which", ["bmm_fc", "four_d"])
def test_a_batch_of_products_is_one_fused_region(tmp_path, which):
    """bmm (after a Linear, its own region) and a 4-d matmul with an epilogue: one launch of every product (the
    launcher's batched operands, the bound function's batched checks and (batch x M, N) outputs)."""
    path = _batched(tmp_path, which)
    kinds, unfused = kinds_and_unfused(path)
    assert kinds == ["gemm_epilogue"] * (2 if which == "bmm_fc" else 1)
    assert unfused == (["Tensor.view"] if which == "bmm_fc" else [])  # the view of fc's output, as with triton
    source = compile_cuda(path).source
    check_emitted(source)
    assert "ops, scheme = batched_gemm_operands(ext, x, y, GEMM_SCHEME)" in source
    assert "kf_gemm_args(a, a_scale, b, b_scale, scheme, true);" in source
    assert "torch::empty({g.batch * g.M, g.N}, options)" in source


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_batched_cpp_glue_compiles_against_torch_headers(tmp_path):
    ns = emitted_constants(compile_cuda(_batched(tmp_path, "four_d")).source)
    assert cpp_syntax_errors(ns, tmp_path) == ""


@pytest.mark.parametrize("kernel", BMM_SIZES)
def test_batched_operands_pick_the_kernel_and_lay_out_each_product(kernel):
    """x (B, M, K) as (B, M, .) rows and y (B, K, N) as its per-product transpose (B, N, .), each row's scale per
    product; the scheme as for one product of M rows (the GEMV), or of all B M N K multiply-adds (the CUDA-core
    tile)."""
    B, M, K, N = BMM_SIZES[kernel]
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(B, M, K, generator=gen), torch.randn(B, K, N, generator=gen)
    (a, a_scale, b, b_scale), got = runtime.batched_gemm_operands(_Parts, x, y, "fp16x3p")
    assert got == runtime.SCHEME_IDS["fp16x3p" if kernel == "tensor_core" else "fp64"]
    assert a.shape == (B, M, K) and b.shape == (B, N, K) and a.is_contiguous() and b.is_contiguous()
    assert torch.equal(b.float(), y.transpose(1, 2).to(b.dtype).float())
    assert torch.equal(a.float(), x.to(a.dtype).float())
    if kernel == "tensor_core":
        assert a_scale.shape == (B, M) and b_scale.shape == (B, N)


def test_on_by_default_and_off_with_the_switch(tmp_path, monkeypatch):
    path = write_problem(tmp_path, *TWO_VALUES, name="two_values")
    assert kinds_and_unfused(path) == (["gemm_epilogue", "gemm_epilogue"], [])
    monkeypatch.setenv(PRODUCTS_SWITCH, "0")
    kinds, unfused = kinds_and_unfused(path)
    assert kinds == ["gemm_epilogue"] and unfused


@pytest.mark.parametrize("k", [LONG_K - 1, LONG_K])
def test_a_long_k_product_stays_a_torch_call_with_its_reason(tmp_path, k):
    """No split-K in CUDA: a product of two values over K >= LONG_K is left to torch, saying why (one short of it
    is fused); a Linear over the same K keeps its region."""
    path = write_problem(tmp_path, "self.fc = nn.Linear(in_features, 3)", "return torch.relu(self.fc(x) + x @ x.t())",
                         batch=3, k=k, n=3, name="long_k")
    (v,) = variants(capture_problem(load_problem(path, {}), "cpu"), KINDS)
    fused = [r.kind for r in v.regions if r.fused]
    no_split_k = [why for why in unfused_reasons(v).values() if "has no split-K" in why]
    if k < LONG_K:
        assert fused == ["gemm_epilogue", "gemm_epilogue"] and not no_split_k
    else:
        assert fused == ["gemm_epilogue"] and len(no_split_k) == 1, unfused_reasons(v)


class _Parts:
    """An extension whose split is torch's, unpadded (the scheme and layout are under test, not the kernel)."""

    @staticmethod
    def split_rows(t):
        return t.half(), torch.ones(t.shape[0])


@pytest.mark.parametrize(("m", "n", "k", "scheme"), [(16, 4096, 4096, "fp64"), (17, 70, 129, "fp64"),
                                                     (512, 512, 1024, "fp64"), (512, 513, 1024, "fp16x3p"),
                                                     (4096, 4096, 4096, "fp16x3p")])
def test_small_gemms_take_the_cuda_core_tile(m, n, k, scheme):
    """At most SKINNY_M rows or CUDA_CORE_MNK multiply-adds: double sums on the CUDA cores, for either operand
    layout and for a value's operand (not cached) as for a weight's."""
    x = torch.empty(m, k)
    for kn in (False, True):
        w = torch.empty((k, n) if kn else (n, k))
        for cached in (True, False):
            _, got = runtime.gemm_operands(_Parts, x, w, kn, "fp16x3p", cached=cached)
            assert got == runtime.SCHEME_IDS[scheme], (m, n, k, kn, cached)


def test_the_norm_kinds_do_not_take_a_products_walk_over(tmp_path, products):
    """Their CUDA code reads a weight parameter: after a product of two values the GroupNorm stays a torch call."""
    path = write_problem(tmp_path, *PRODUCT_NORM, name="product_norm", batch=12)
    (v,) = variants(capture_problem(load_problem(path, {}), "cpu"), KINDS)
    assert [r.kind for r in v.regions if r.fused] == ["gemm_epilogue", "gemm_epilogue"]
    reasons = unfused_reasons(v)
    assert any("gemm_groupnorm" in why and "does not take" in why for why in reasons.values()), reasons


@pytest.mark.skipif(not KB1.is_dir(), reason="needs KernelBench's level 1 ($KB1 or ../shared)")
@pytest.mark.parametrize("name", LEVEL1)
def test_kernelbench_level1_products_are_fused(name, products):
    compiled = compile_cuda(KB1 / f"{name}.py", LEVEL1[name])
    assert compiled.fallback is None and compiled.backend == "cuda"
    assert [r.kind for v in compiled.variants for r in v.regions if r.fused] == ["gemm_epilogue"]
    check_emitted(compiled.source)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_product_source_compiles(tmp_path, products):
    """The CUDA side of a product region is the weight GEMM's (only the Python launcher differs): nvcc builds it."""
    path = write_problem(tmp_path, *TWO_VALUES, name="two_values")
    cu = ast.literal_eval(re.search(r"CUDA_SRC = (r\'\'\'.*?\'\'\')", compile_cuda(path).source, re.S).group(1))
    (tmp_path / "k.cu").write_text(cu)
    r = subprocess.run(["nvcc", "-c", "k.cu", "-o", "k.o", "-std=c++17", *NVCC_FLAGS,
                        "-gencode=arch=compute_80,code=sm_80"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]


class _Fake(runtime.CudaProductFn):
    """CudaProductFn with the launch done by torch (no GPU here): relu(x @ y) * scale, z = x @ y."""

    @staticmethod
    def launch(model, x, y, save_z=False):
        z = (x.double() @ y.double()).float()
        out = torch.relu(z) * model.scale
        return ((out,), z) if save_z else out

    @staticmethod
    def params(model):
        return (model.scale,)

    @staticmethod
    def epilogue(model, fwd_state, cast, matmul):
        return torch.relu(matmul) * cast(model.scale)


@pytest.mark.parametrize(("same", "y_lead"), [(False, ()), (True, ()), (False, (2, 3))], ids=["x@y", "x@x", "batched"])
def test_product_backward_matches_torch(same, y_lead):
    """dX = dZ y^T, dY = X^T dZ and the epilogue's parameter gradient, for a 3-d x @ a 2-d y, for x @ x and for a
    batch of products (each product's own)."""
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Module()
    model.scale = torch.nn.Parameter(torch.rand(11, generator=gen) + 0.5)
    x = torch.randn(2, 11, 11, generator=gen) if same else torch.randn(*(y_lead or (2,)), 5, 7, generator=gen)
    y = x[0] if same else torch.randn(*y_lead, 7, 11, generator=gen)
    x.requires_grad_(True)
    if not same:
        y.requires_grad_(True)
    yy = x[0] if same else y
    out = _Fake.run(model, x, yy)
    grad = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, [x, model.scale] if same else [x, y, model.scale], grad)
    ref_out = torch.relu(x.double() @ yy.double()) * model.scale.double()
    want = torch.autograd.grad(ref_out, [x, model.scale] if same else [x, y, model.scale], grad.double())
    assert torch.allclose(out.double(), ref_out, atol=1e-5)
    for g, w in zip(got, want):
        assert torch.allclose(g.double(), w.double(), rtol=1e-4, atol=1e-4), (g, w)
    with torch.no_grad():
        assert torch.equal(_Fake.run(model, x, yy), out.detach())  # no Function where no gradient is needed


# ---- on a GPU (benchmarks/cuda_backend/gpu_sm90.sh OUT products) ------------------------------------------------
@pytest.mark.gpu
@requires_cuda
def test_gpu_two_values_meet_the_contract_and_the_gradient_contract(tmp_path, products):
    _both_contracts(write_problem(tmp_path, *TWO_VALUES, name="two_values"))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.skipif(not KB1.is_dir(), reason="needs KernelBench's level 1 ($KB1 or ../shared)")
@pytest.mark.parametrize("name", list(LEVEL1))
def test_gpu_kernelbench_level1_products_meet_the_contract(name, products):
    """At the small sizes (odd: every tile edge masked); gpu_sm90.sh's step runs them at full size."""
    _, _, contract = _contract(KB1 / f"{name}.py", LEVEL1[name])
    assert contract.correct, contract.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("which", ["bmm_fc", "four_d"])
def test_gpu_batched_products_meet_both_contracts(tmp_path, which):
    _both_contracts(_batched(tmp_path, which))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("kernel", BMM_SIZES)
def test_gpu_bmm_on_each_kernel_meets_the_contract(tmp_path, kernel):
    """One bmm and its epilogue on each kernel (BMM_SIZES): every product's rows, columns and scales its own."""
    B, M, K, N = BMM_SIZES[kernel]
    path = write_problem(tmp_path, *BMM, batch=M + N, k=K, n=M, inputs=f"torch.rand({B}, batch_size, in_features)",
                         name=f"bmm_{kernel}")
    _, _, contract = _contract(path, {})
    assert contract.correct, contract.failures

