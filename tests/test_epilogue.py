"""Every epilogue op, fused after a Linear at odd sizes (37 x 70 -> 129), run in Triton's interpreter and
checked with the accuracy contract against eager fp32 and float64."""

from __future__ import annotations

import pytest
import torch
import triton

from kfuse.load import load_problem
from kfuse.ops import POINTWISE, TANH
from kfuse.optimize import Options, load_module, optimize
from kfuse_testing import write_problem

LINEAR = "self.lin = nn.Linear(in_features, out_features)"
CPU = Options(device="cpu", trials=2)

# (name, extra __init__ lines, the expression applied to y = self.lin(x))
CASES = [
    ("add_scalar", "", "y + 0.75"),
    ("sub_scalar_left", "", "1.5 - y"),
    ("mul_attr", "self.m = 2.5", "y * self.m"),
    ("div_scalar", "", "y / 3.0"),
    ("neg", "", "-y"),
    ("relu", "", "torch.relu(y)"),
    ("leaky_relu", "self.act = nn.LeakyReLU(0.2)", "self.act(y)"),
    ("gelu", "", "F.gelu(y)"),
    ("gelu_tanh", "", "F.gelu(y, approximate='tanh')"),
    ("sigmoid", "", "torch.sigmoid(y)"),
    ("silu", "self.act = nn.SiLU()", "self.act(y)"),
    ("tanh", "", "torch.tanh(y)"),
    ("hardtanh", "self.act = nn.Hardtanh(-0.5, 0.5)", "self.act(y)"),
    ("clamp", "", "torch.clamp(y, min=-0.3, max=0.4)"),
    ("clamp_min", "", "y.clamp(min=0.1)"),
    ("clamp_max", "", "torch.clamp(y, max=-0.1)"),
    ("softplus", "", "F.softplus(y, beta=2.0, threshold=1.0)"),
    ("mish", "", "F.mish(y)"),
    ("hardswish", "", "F.hardswish(y)"),
    ("hardsigmoid", "", "F.hardsigmoid(y)"),
    ("exp", "", "torch.exp(y)"),
    ("abs", "", "torch.abs(y)"),
    ("vector_param_mul", "self.s = nn.Parameter(torch.randn(out_features))", "y * self.s"),
    ("vector_buffer_add", "self.register_buffer('b', torch.randn(1, out_features))", "y + self.b"),
    ("single_param", "self.s = nn.Parameter(torch.randn(1))", "y * self.s"),
    ("x_plus_x", "", "y + y"),
    ("saved_value", "self.s = nn.Parameter(torch.randn(out_features))", "y * self.s + y"),
    ("sigmoid_residual", "", "2 * torch.sigmoid(y) + y"),
]


def test_every_table_op_is_tested():
    spelled = " ".join(name for name, _, _ in CASES)
    missing = [op for op in POINTWISE if op not in spelled and op not in ("add", "sub", "mul", "div", "identity")]
    assert not missing


@pytest.mark.parametrize("name, init, expr", CASES, ids=[c[0] for c in CASES])
def test_epilogue_op(tmp_path, name, init, expr):
    path = write_problem(tmp_path, f"{LINEAR}\n{init}", f"y = self.lin(x)\nreturn {expr}",
                         inputs="torch.randn(batch_size, in_features)")
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.kind for r in result.compiled.regions] == ["gemm_epilogue"]
    assert result.compiled.unfused == []


def test_matmul_against_kn_parameter(tmp_path):
    init = "self.w = nn.Parameter(torch.randn(in_features, out_features) * 0.1)"
    path = write_problem(tmp_path, init, "return torch.relu(x @ self.w)", k=33, n=17, batch=1)
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [("gemm_epilogue", ["matmul", "relu"])]


def test_linear_without_bias_and_second_linear(tmp_path):
    init = "self.a = nn.Linear(in_features, 48, bias=False)\nself.b = nn.Linear(48, out_features)"
    path = write_problem(tmp_path, init, "return self.b(torch.tanh(self.a(x))) * 0.5")
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [r.ops() for r in result.compiled.regions] == [["linear", "tanh"], ["linear", "mul"]]


def test_fallback_op_still_correct(tmp_path):
    path = write_problem(tmp_path, LINEAR, "y = self.lin(x)\nreturn torch.cumsum(torch.relu(y), dim=1)")
    result = optimize(load_problem(path), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert result.compiled.unfused == ["torch.cumsum"]


TANH_KERNEL = '''
import triton
import triton.language as tl

from kfuse.kernels.runtime import _tanh


@triton.jit
def tanh_kernel(x_ptr, o_ptr, n, B: tl.constexpr):
    offs = tl.program_id(0) * B + tl.arange(0, B)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(o_ptr + offs, {expr}, mask=m)
'''


def test_tanh_accuracy_in_ulps(tmp_path):
    """ops.TANH (runtime._tanh, the expm1 / Kahan form) in ulps of the float64 tanh rounded to fp32, over 7
    decades of |x|:
    measured 0.81 ulp on average and 5.7 at worst (torch.tanh: 0.22 / 0.51). A series-based fp32 tanh measured
    0.23 / 1.6 but slowed problems 24 and 29 by 7-11% on the H100 and is not float64-accurate for the dZ
    kernels, which call TANH on float64 values (benchmarks/gemm/NOTES.md, "A more accurate tanh and a float64
    logsumexp"): not adopted. This pins the current accuracy so that it does not get worse."""
    path = tmp_path / "tanh_kernel.py"
    path.write_text(TANH_KERNEL.format(expr=TANH.format("x")))
    kernel = load_module(path).tanh_kernel
    torch.manual_seed(0)
    x = torch.cat([torch.randn(4000) * s for s in (1e-3, 1e-2, 0.1, 0.5, 1.0, 3.0, 30.0)]
                  + [torch.tensor([0.0, 0.6249999, 0.625, -0.625, 15.0, 100.0, -1e30, 1e-30])])
    out = torch.empty_like(x)
    kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), B=1024)
    exact = torch.tanh(x.double())
    ulp = (exact.float().abs().nextafter(torch.tensor(float("inf"))) - exact.float().abs()).double()
    err = (out.double() - exact).abs() / ulp
    assert err.max() < 8.0 and err.mean() < 1.0, (err.max().item(), err.mean().item())
