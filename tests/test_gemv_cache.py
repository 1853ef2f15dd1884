"""The `gemm_rowsum` region's float64 weight and bias sums (runtime.cached_gemv_sums): computed once and reused while W
and b are unchanged, recomputed whenever either changes -- in place under no_grad, by an optimizer step, by
load_state_dict, or by reassigning a Parameter. Never stale: every result is compared with eager after each change.
Two layouts: nn.Linear with a bias (W (N, K)) and `x @ W` without one (W (K, N): the sums run over W's columns)."""

from __future__ import annotations

import pytest
import torch

from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module
from kfuse_testing import write_problem

CASES = {
    # name: (init, forward, weight attribute, bias attribute or None)
    "linear_sum": ("self.lin = nn.Linear(in_features, out_features)",
                   "return torch.sigmoid(torch.sum(self.lin(x), dim=1, keepdim=True))", "lin.weight", "lin.bias"),
    "kn_mean": ("self.w = nn.Parameter(torch.randn(in_features, out_features) * 0.1)",
                "return torch.tanh(torch.mean(x @ self.w, dim=1)) * 2.0", "w", None),
}


def attr(model: torch.nn.Module, path: str | None):
    return model.get_parameter(path) if path else None


def set_param(model: torch.nn.Module, path: str, value: torch.Tensor) -> None:
    owner, _, name = path.rpartition(".")
    setattr(model.get_submodule(owner) if owner else model, name, torch.nn.Parameter(value.clone()))


@pytest.fixture(scope="module", params=list(CASES))
def generated(request, tmp_path_factory):
    init, forward, w, b = CASES[request.param]
    tmp = tmp_path_factory.mktemp("gemv")
    prob = load_problem(write_problem(tmp, init, forward, batch=5, k=70, n=129, name=request.param))
    compiled = compile_problem(prob, Options(device="cpu"))
    assert [r.kind for r in compiled.regions if r.kind != "torch"] == ["gemm_rowsum"]
    path = tmp / f"{request.param}_new.py"
    path.write_text(compiled.source)
    return prob, load_module(path), w, b


@pytest.fixture
def pair(generated, monkeypatch):
    """(eager Model, ModelNew with the same state, list of recomputations, input, weight path, bias path)."""
    prob, module, w, b = generated
    calls = []
    real = module.gemv_sums

    def counting(weight, bias, kn):
        calls.append(tuple(weight.shape))
        return real(weight, bias, kn)

    monkeypatch.setattr(module, "gemv_sums", counting)
    torch.manual_seed(0)
    ref = prob.build()
    new = prob.build(cls=module.ModelNew)
    new.load_state_dict(ref.state_dict())
    torch.manual_seed(1)
    return ref, new, calls, prob.inputs()[0], w, b


def same(new, ref, x) -> None:
    with torch.no_grad():
        got, want = new(x), ref(x)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


def test_second_call_reuses_the_sums(pair):
    ref, new, calls, x, w, _ = pair
    same(new, ref, x)
    sums = attr(new, w)._kfuse_gemv[2]
    same(new, ref, 2 * x - 1)
    same(new, ref, x)
    assert len(calls) == 1 and attr(new, w)._kfuse_gemv[2] is sums
    assert sums[0].dtype == torch.float64 and sums[1].shape == (1,)


def test_in_place_change_under_no_grad(pair):
    ref, new, calls, x, w, b = pair
    same(new, ref, x)
    with torch.no_grad():
        for m in (ref, new):
            attr(m, w).mul_(-3.0)
            attr(m, w)[0, 0] = 1.5
    same(new, ref, x)
    assert len(calls) == 2
    if b is not None:  # the bias alone changing invalidates too
        with torch.no_grad():
            for m in (ref, new):
                attr(m, b).add_(0.25)
        same(new, ref, x)
        assert len(calls) == 3


def test_reassigned_parameters(pair):
    ref, new, calls, x, w, b = pair
    same(new, ref, x)
    value = torch.randn_like(attr(ref, w))
    for m in (ref, new):
        set_param(m, w, value)
    same(new, ref, x)
    assert len(calls) == 2
    if b is not None:
        value = torch.randn_like(attr(ref, b))
        for m in (ref, new):
            set_param(m, b, value)
        same(new, ref, x)
        assert len(calls) == 3
        # a new bias on the old one's storage and version: still a different tensor, so recomputed
        new.get_submodule(b.rpartition(".")[0]).bias = torch.nn.Parameter(attr(new, b).data)
        same(new, ref, x)
        assert len(calls) == 4


def test_load_state_dict(pair, generated):
    prob = generated[0]
    ref, new, calls, x, _, _ = pair
    same(new, ref, x)
    torch.manual_seed(42)
    other = prob.build().state_dict()
    ref.load_state_dict(other)
    new.load_state_dict(other)
    same(new, ref, x)
    assert len(calls) == 2


def test_training_steps_recompute_after_each_step(pair):
    """Forward + backward through the autograd Function, then an SGD step, three times: outputs and gradients
    match eager at every step (the cache follows the optimizer's in-place updates)."""
    ref, new, calls, x, _, _ = pair
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, new)]
    for step in range(3):
        outs = []
        for m, opt in zip((ref, new), opts):
            opt.zero_grad()
            xi = x.clone().requires_grad_(True)
            out = m(xi)
            (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
            outs.append((out.detach(), xi.grad, [p.grad for p in m.parameters()]))
        (o_ref, gx_ref, gp_ref), (o_new, gx_new, gp_new) = outs
        assert torch.allclose(o_new, o_ref, atol=1e-5, rtol=1e-5), step
        assert torch.allclose(gx_new, gx_ref, atol=1e-5, rtol=1e-5), step
        assert all(torch.allclose(a, c, atol=1e-5, rtol=1e-5) for a, c in zip(gp_new, gp_ref)), step
        for opt in opts:
            opt.step()
    assert len(calls) == 3
