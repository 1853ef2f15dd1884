"""Every model structure a PyTorch user writes gives a verified ModelNew (CPU, Triton's interpreter, small sizes).

Containers and nested submodules, parameters and buffers at dotted paths, functional calls, several inputs and
outputs (integer ones too), in-place writes, views sized from tensors, forwards torch.fx cannot trace (a submodule
kept whole, or the whole forward run unchanged, with the reason), and bare matrix products on the GEMM.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from kfuse.load import load_problem
from kfuse.optimize import Options, optimize, report

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def verified(tmp_path: Path, source: str, name: str = "problem") -> dict:
    """kfuse optimize on the problem `source` (CPU): its report, after asserting the contract held."""
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER + textwrap.dedent(source))
    prob = load_problem(path)
    opts = Options(device="cpu", trials=2)
    result = optimize(prob, opts, workdir=tmp_path)
    rep = report(prob, opts, result, None)
    assert rep["correct"], rep["failures"]
    return rep


def kinds(rep: dict) -> list[str]:
    return [r["kind"] for r in rep["regions"]]


def test_sequential_modulelist_moduledict_nested_buffers(tmp_path):
    rep = verified(tmp_path, '''
        class Block(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.inner = nn.ModuleDict({"lin": nn.Linear(n, n), "act-fn": nn.GELU()})
                self.register_buffer("shift", torch.linspace(-1, 1, n))
            def forward(self, x):
                return self.inner["act-fn"](self.inner["lin"](x)) + self.shift

        class Model(nn.Module):
            def __init__(self, i, h, o):
                super().__init__()
                self.network = nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Sequential(nn.Linear(h, h), nn.Tanh()))
                self.blocks = nn.ModuleList([Block(h) for _ in range(2)])
                self.head = nn.Linear(h, o)
            def forward(self, x):
                x = self.network(x)
                for b in self.blocks:
                    x = b(x)
                return self.head(x)

        batch_size = 17
        i, h, o = 33, 48, 21
        def get_inputs():
            return [torch.randn(batch_size, i)]
        def get_init_inputs():
            return [i, h, o]
        ''')
    assert kinds(rep).count("gemm_epilogue") == 5 and not rep["unfused_ops"]
    assert "nn.GELU blocks.1.inner.act-fn" in rep["regions"][3]["ops"]


def test_functional_several_inputs_and_outputs_integer_output(tmp_path):
    rep = verified(tmp_path, '''
        class Model(nn.Module):
            def __init__(self, k, n):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(n, k) / k ** 0.5)
                self.bias = nn.Parameter(torch.randn(n))
            def forward(self, x, y):
                z = F.silu(F.linear(x, self.weight, self.bias)) * 2.0
                return z, (z + y, z.argmax(dim=1)), {"sum": y.sum(dim=1)}

        batch_size = 13
        k, n = 29, 40
        def get_inputs():
            return [torch.randn(batch_size, k), torch.randn(batch_size, n)]
        def get_init_inputs():
            return [k, n]
        ''')
    assert kinds(rep)[0] == "gemm_epilogue"
    assert "Tensor.argmax" in rep["unfused_ops"]


def test_in_place_writes_follow_eager(tmp_path):
    """`identity = y` then an in-place ReLU, `+=` and mul_: eager's identity sees every write."""
    rep = verified(tmp_path, '''
        class Model(nn.Module):
            def __init__(self, k, n):
                super().__init__()
                self.lin = nn.Linear(k, n)
                self.act = nn.ReLU(inplace=True)
                self.lin2 = nn.Linear(n, n)
            def forward(self, x):
                y = self.lin(x)
                identity = y
                y = self.act(y)
                y += 1.0
                y.mul_(2.0)
                z = F.relu(self.lin2(y), inplace=True)
                return z + identity

        batch_size = 11
        k, n = 30, 24
        def get_inputs():
            return [torch.randn(batch_size, k)]
        def get_init_inputs():
            return [k, n]
        ''')
    assert rep["fallback"] is None and kinds(rep).count("gemm_epilogue") == 2


def test_in_place_write_into_an_input_stays_a_write(tmp_path):
    verified(tmp_path, '''
        class Model(nn.Module):
            def __init__(self, k, n):
                super().__init__()
                self.lin = nn.Linear(k, n)
            def forward(self, x):
                x.mul_(0.5)
                return self.lin(x) + x.sum()

        batch_size = 9
        k, n = 30, 24
        def get_inputs():
            return [torch.randn(batch_size, k)]
        def get_init_inputs():
            return [k, n]
        ''')


def test_view_sized_from_the_tensor_and_host_values(tmp_path):
    rep = verified(tmp_path, '''
        class Model(nn.Module):
            def __init__(self, k, n):
                super().__init__()
                self.lin = nn.Linear(k, n)
            def forward(self, x):
                y = torch.sigmoid(self.lin(x.view(x.size(0), -1)))
                return y[:, : y.shape[1] // 2]

        batch_size = 10
        k, n = 24, 36
        def get_inputs():
            return [torch.randn(batch_size, 4, 6)]
        def get_init_inputs():
            return [k, n]
        ''')
    assert "Tensor.size" not in rep["unfused_ops"]


def test_untraceable_submodule_is_kept_whole(tmp_path):
    rep = verified(tmp_path, '''
        class Gate(nn.Module):
            def forward(self, x):
                if x.mean() > 0:
                    return x * 2
                return x - 1

        class Model(nn.Module):
            def __init__(self, k, n):
                super().__init__()
                self.lin, self.gate, self.lin2 = nn.Linear(k, n), Gate(), nn.Linear(n, n)
            def forward(self, x):
                return torch.sigmoid(self.lin2(self.gate(torch.relu(self.lin(x)))))

        batch_size = 16
        k, n = 40, 24
        def get_inputs():
            return [torch.randn(batch_size, k)]
        def get_init_inputs():
            return [k, n]
        ''')
    assert rep["unfused_ops"] == ["Gate gate"] and kinds(rep).count("gemm_epilogue") == 2


@pytest.mark.parametrize("forward, reason", [
    ("y = self.lin(x)\nif y.sum() > 0:\n    y = y * 2\nreturn y.relu()", "cannot be traced"),
    ("self.last = self.lin(x)\nreturn self.last * 2", "assigns module attributes"),
    ("v = x[:, :4]\nx.add_(1.0)\nreturn self.lin(x) + v.sum()", "in-place write"),
])
def test_untraceable_forward_runs_unchanged(tmp_path, forward, reason):
    body = textwrap.indent(forward, " " * 16)
    rep = verified(tmp_path, f'''
        class Model(nn.Module):
            def __init__(self, k, n):
                super().__init__()
                self.lin = nn.Linear(k, n)
                self.last = None
            def forward(self, x):
{body}

        batch_size = 16
        k, n = 40, 24
        def get_inputs():
            return [torch.randn(batch_size, k)]
        def get_init_inputs():
            return [k, n]
        ''')
    assert reason in rep["fallback"] and rep["unfused_ops"] == ["Model.forward"]


def test_nothing_fused_gets_a_short_file_that_says_so(tmp_path):
    verified(tmp_path, '''
        class Model(nn.Module):
            def forward(self, x):
                return torch.sort(x, dim=1).values[:, : x.shape[1] // 2]

        batch_size = 16
        def get_inputs():
            return [torch.randn(batch_size, 40)]
        def get_init_inputs():
            return []
        ''')
    source = (tmp_path / "problem_candidate.py").read_text()
    assert "Nothing here is fused" in source and "import triton" not in source and len(source.splitlines()) < 150


MATMULS = {  # (expression, inputs) with sizes K, N, N2 (the CPU test's 70, 129, 33; the GPU test's larger ones)
    "two inputs": ("a @ b", "torch.randn(batch_size, {K}), torch.randn({K}, {N})"),
    "transposed": ("torch.matmul(a.T, b.t())", "torch.randn({K}, batch_size), torch.randn({N}, {K})"),
    "strided": ("torch.mm(a[:, ::2], b)", "torch.randn(batch_size, 2 * {K}), torch.randn({K}, {N})"),
    "3-d @ 2-d": ("torch.matmul(a, b).relu()", "torch.randn(batch_size, 3, {K}), torch.randn({K}, {N2})"),
    "4-d einsum": ('torch.einsum("bijl,lk->bijk", a, b)', "torch.randn(batch_size, 2, 3, {K}), torch.randn({K}, {N2})"),
    "bmm": ("torch.bmm(a, b) * 0.5", "torch.randn(batch_size, 7, {K}), torch.randn(batch_size, {K}, {N2})"),
    "4-d batched": ("a @ b.transpose(-2, -1)",
                    "torch.randn(batch_size, 2, 9, {K}), torch.randn(batch_size, 2, 11, {K})"),
    "matrix-vector": ("torch.matmul(a, b)", "torch.randn(batch_size, 10 * {K}), torch.randn(10 * {K}, 1)"),
    "vector": ("a @ b", "torch.randn(batch_size, 4 * {K}), torch.randn(4 * {K})"),
}
CPU_SIZES = {"K": 70, "N": 129, "N2": 33}
GPU_SIZES = {"K": 517, "N": 263, "N2": 131}


@pytest.mark.parametrize("name", sorted(MATMULS))
def test_bare_matmul_on_the_gemm(tmp_path, name):
    expr, inputs = MATMULS[name]
    inputs = inputs.format(**CPU_SIZES)
    rep = verified(tmp_path, f'''
        class Model(nn.Module):
            def forward(self, a, b):
                return {expr}

        batch_size = 37
        def get_inputs():
            return [{inputs}]
        def get_init_inputs():
            return []
        ''')
    assert "gemm_epilogue" in kinds(rep) and not rep["unfused_ops"] or name == "strided", rep["regions"]


def test_einsum_as_matmul():
    from kfuse.capture import einsum_as_matmul

    assert einsum_as_matmul("ij,jk->ik", (2, 2)) and einsum_as_matmul("bij,bjk->bik", (3, 3))
    assert einsum_as_matmul("bijl,lk->bijk", (4, 2))
    assert not einsum_as_matmul("ij,jk->ki", (2, 2))  # transposed result
    assert not einsum_as_matmul("ij,kj->ik", (2, 2))  # b transposed: not matmul's operand order
    assert not einsum_as_matmul("bij,cjk->bik", (3, 3))  # different batch letters
    assert not einsum_as_matmul("ii,ij->ij", (2, 2))


def test_value_matmul_trains(tmp_path):
    """A product of two inputs inside a region: gradients reach both (the region's torch reference)."""
    path = tmp_path / "p.py"
    path.write_text(HEADER + textwrap.dedent('''
        class Model(nn.Module):
            def forward(self, a, b):
                return torch.tanh(a @ b)
        def get_inputs():
            return [torch.randn(5, 7), torch.randn(7, 3)]
        def get_init_inputs():
            return []
        '''))
    prob = load_problem(path)
    result = optimize(prob, Options(device="cpu", trials=1), workdir=tmp_path)
    from kfuse.optimize import load_module

    new = load_module(result.candidate_path).ModelNew()
    a, b = (torch.randn(5, 7, requires_grad=True), torch.randn(7, 3, requires_grad=True))
    new(a, b).sum().backward()
    a2, b2 = a.detach().requires_grad_(), b.detach().requires_grad_()
    torch.tanh(a2 @ b2).sum().backward()
    torch.testing.assert_close(a.grad, a2.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.grad, b2.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(MATMULS))
def test_bare_matmul_on_the_gpu(tmp_path, name):
    """The same products on the GPU's fp32-accurate scheme (fp16x3p, batched tiles included), odd sizes."""
    expr, inputs = MATMULS[name]
    path = tmp_path / "p.py"
    path.write_text(HEADER + textwrap.dedent(f'''
        class Model(nn.Module):
            def forward(self, a, b):
                return {expr}

        batch_size = 301
        def get_inputs():
            return [{inputs.format(**GPU_SIZES)}]
        def get_init_inputs():
            return []
        '''))
    prob = load_problem(path)
    opts = Options(device="cuda", trials=3)
    result = optimize(prob, opts, workdir=tmp_path)
    rep = report(prob, opts, result, None)
    assert rep["correct"], rep["failures"]


def test_torch_calls_run_in_strict_fp32(tmp_path):
    """cuDNN's TF32 (on by default) would put a kept convolution 1e-3 from float64: ModelNew turns it off around
    its torch calls, and restores the user's flags after."""
    path = tmp_path / "p.py"
    path.write_text(HEADER + textwrap.dedent('''
        SEEN = []

        class Probe(nn.Module):
            def forward(self, x):
                if x.sum() > -1e30:  # data-dependent: kept whole, a torch call
                    SEEN.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
                return x

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin, self.probe = nn.Linear(8, 8), Probe()
            def forward(self, x):
                return self.probe(torch.relu(self.lin(x)))
        def get_inputs():
            return [torch.randn(4, 8)]
        def get_init_inputs():
            return []
        '''))
    prob = load_problem(path)
    result = optimize(prob, Options(device="cpu", trials=1), workdir=tmp_path)
    from kfuse.optimize import load_module

    module = load_module(result.candidate_path)
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    try:
        module.ModelNew()(torch.randn(4, 8))
        assert module.SEEN[-1] == (False, False)
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
