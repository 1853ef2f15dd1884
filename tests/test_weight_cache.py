"""The weight split cache of generated files (runtime.cached_split): precomputed fp16 hi/lo parts and power-of-two
scales are reused while the weight is unchanged and recomputed whenever it changes -- in place under no_grad, by an
optimizer step, by load_state_dict, or by reassigning the Parameter. Never stale.

The split scheme ("fp16x3p", the GPU default) is forced in the interpreter by replacing the generated module's
gemm_scheme: its arithmetic (fp16 dots, power-of-two scales) runs there too.

Known limitation (runtime.cached_split's docstring): a write through `weight.data` bypasses the version counter
the cache keys on, so it is NOT seen; after such a write set `weight._kfuse_split = None`. The xfail test below
records it: if PyTorch or kfuse ever catch it, the test says so (strict xfail) and the docstring should change.
"""

from __future__ import annotations

import pytest
import torch

from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module
from kfuse_testing import SEEDS, SMALL

NAME = "12_gemm_multiply_leakyrelu"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    prob = load_problem(SEEDS / f"{NAME}.py", SMALL[NAME])
    path = tmp_path_factory.mktemp("wc") / f"{NAME}_new.py"
    path.write_text(compile_problem(prob, Options(device="cpu")).source)
    module = load_module(path)
    module.GEMM_SCHEME = "fp16x3p"
    module.gemm_scheme = lambda x: "fp16x3p"  # the split scheme, in the interpreter
    return prob, module


@pytest.fixture
def pair(generated, monkeypatch):
    """(eager Model, ModelNew with the same state, split counter, input)."""
    prob, module = generated
    calls = []
    real = module.split_weight

    def counting_split(w):
        calls.append(w.shape)
        return real(w)

    monkeypatch.setattr(module, "split_weight", counting_split)
    torch.manual_seed(0)
    ref = prob.build()
    torch.manual_seed(0)
    new = prob.build(cls=module.ModelNew)
    new.load_state_dict(ref.state_dict())
    torch.manual_seed(1)
    x = prob.inputs()[0]
    return ref, new, calls, x


def same(new, ref, x) -> None:
    with torch.no_grad():
        got, want = new(x), ref(x)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


def test_split_scheme_really_runs(pair, generated):
    _, module = generated
    ref, new, calls, x = pair
    same(new, ref, x)
    assert len(calls) == 1
    key, (w_hi, w_lo, w_scale) = new.gemm.weight._kfuse_split
    assert w_hi.dtype == torch.float16 and w_lo.dtype == torch.float16
    assert torch.all(torch.log2(w_scale) == torch.round(torch.log2(w_scale)))  # powers of two


def test_unchanged_weight_reuses_the_same_parts(pair):
    ref, new, calls, x = pair
    same(new, ref, x)
    parts = new.gemm.weight._kfuse_split[1]
    same(new, ref, 2 * x)
    same(new, ref, x)
    assert len(calls) == 1
    assert new.gemm.weight._kfuse_split[1] is parts


def test_in_place_change_under_no_grad(pair):
    ref, new, calls, x = pair
    same(new, ref, x)
    with torch.no_grad():
        for m in (ref, new):
            m.gemm.weight.mul_(-3.0)
            m.gemm.weight[0, 0] = 123.0
    same(new, ref, x)
    assert len(calls) == 2


def test_optimizer_step(pair):
    ref, new, calls, x = pair
    same(new, ref, x)
    for m in (ref, new):
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        opt.zero_grad()
        m.gemm.weight.grad = torch.ones_like(m.gemm.weight)  # the same step for both (not a backward test)
        m.gemm.bias.grad = torch.ones_like(m.gemm.bias)
        opt.step()
    same(new, ref, x)
    assert len(calls) == 2


def test_load_state_dict(pair, generated):
    prob, _ = generated
    ref, new, calls, x = pair
    same(new, ref, x)
    torch.manual_seed(42)
    other = prob.build()
    ref.load_state_dict(other.state_dict())
    new.load_state_dict(other.state_dict())
    same(new, ref, x)
    assert len(calls) == 2


def test_reassigned_parameter(pair):
    ref, new, calls, x = pair
    same(new, ref, x)
    w = torch.randn_like(ref.gemm.weight)
    ref.gemm.weight = torch.nn.Parameter(w.clone())
    new.gemm.weight = torch.nn.Parameter(w.clone())
    same(new, ref, x)
    assert len(calls) == 2


def test_data_write_with_documented_reset(pair):
    ref, new, calls, x = pair
    same(new, ref, x)
    for m in (ref, new):
        m.gemm.weight.data.mul_(0.5)
    new.gemm.weight._kfuse_split = None  # the documented step after writing through .data
    same(new, ref, x)
    assert len(calls) == 2


@pytest.mark.xfail(strict=True, reason="documented limitation: writes through .data bypass the version counter")
def test_data_write_without_reset_is_seen(pair):
    ref, new, calls, x = pair
    same(new, ref, x)
    for m in (ref, new):
        m.gemm.weight.data.mul_(0.5)
    same(new, ref, x)
