"""CUDA graphs for repeated inference calls (kfuse/kernels/graphs.py).

On the CPU: the graph key follows everything a captured forward bakes in (inputs' addresses and shapes,
parameters' versions, plain attributes, modes) and refuses mode-dependent modules in training mode; the emitter
routes forward through replay_forward only when every op is fused. On a GPU: replays give the launches' bits,
and every change a key tracks (in-place writes, reassigned parameters, attributes, a caller's kept result) is
seen, never a stale result.
"""

from __future__ import annotations

import pytest
import torch

from kfuse.kernels import graphs
from kfuse_testing import generate_model, graphed_pair, requires_cuda


class Small(torch.nn.Module):
    def __init__(self, bn: bool = False, drop: bool = False) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 5)
        self.ln = torch.nn.LayerNorm(5)
        self.bn = torch.nn.BatchNorm1d(5) if bn else None
        self.drop = torch.nn.Dropout(0.1) if drop else None
        self.scale = 2.0


def test_key_follows_inputs_parameters_and_attributes():
    m, x = Small(), torch.rand(4, 6)
    k0 = graphs.graph_key(m, (x,))
    assert k0 is not None and k0 == graphs.graph_key(m, (x,))
    assert graphs.graph_key(m, (x.clone(),)) != k0  # another address
    assert graphs.graph_key(m, (torch.rand(3, 6),)) != k0  # another shape
    assert graphs.graph_key(m, (x, 1.5)) != graphs.graph_key(m, (x, 2.5))  # a plain input's value
    with torch.no_grad():
        m.lin.weight.mul_(2.0)  # in place: the version counter moves
    k1 = graphs.graph_key(m, (x,))
    assert k1 != k0
    m.lin.bias = torch.nn.Parameter(torch.zeros(5))  # reassigned
    k2 = graphs.graph_key(m, (x,))
    assert k2 != k1
    m.scale = 3.0  # a plain attribute the forward may read
    k3 = graphs.graph_key(m, (x,))
    assert k3 != k2
    m.ln.eps = 1e-3
    assert graphs.graph_key(m, (x,)) != k3
    m.sizes = [2, 4]
    k_list = graphs.graph_key(m, (x,))
    m.sizes[1] = 8  # a list of settings changed in place
    assert graphs.graph_key(m, (x,)) != k_list
    m.extra = torch.zeros(2)  # a tensor attribute
    k4 = graphs.graph_key(m, (x,))
    m.extra.add_(1.0)
    assert graphs.graph_key(m, (x,)) != k4
    assert graphs.graph_key(m, (object(),)) is None  # an input a key cannot describe


def test_key_refuses_mode_dependent_modules_in_training():
    x = torch.rand(4, 6)
    for m in (Small(bn=True), Small(drop=True)):
        assert graphs.graph_key(m.train(), (x,)) is None
        assert graphs.graph_key(m.eval(), (x,)) is not None
    m = Small(bn=True).eval()
    k = graphs.graph_key(m, (x,))
    m.bn.running_mean.add_(1.0)  # an eval-mode BatchNorm reads its statistics: they are in the key
    assert graphs.graph_key(m, (x,)) != k
    assert graphs.graph_key(Small().train(), (x,)) is not None  # Linear + LayerNorm: mode-independent


def test_cpu_calls_run_the_launches():
    calls = []

    def forward(x):
        calls.append(1)
        return x + 1

    m, x = Small(), torch.rand(4, 6)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(graphs.replay_forward(m, forward, x), x + 1)
    assert len(calls) == 3 and m not in graphs._GRAPHS


def _generate(tmp_path, init: str, forward: str, name: str, **sizes):
    return generate_model(tmp_path, init, forward, name, "cuda" if torch.cuda.is_available() else "cpu", **sizes)


FUSED = ("self.gemm = nn.Linear(in_features, out_features)\nself.ln = nn.LayerNorm(out_features)\n"
         "self.scaling_factor = 1.5",
         "return torch.relu(self.ln(self.gemm(x))) * self.scaling_factor")


@pytest.mark.slow
def test_forward_is_graphed_only_when_every_op_is_fused(tmp_path):
    _, compiled, _ = _generate(tmp_path, *FUSED, "fused")
    assert "return replay_forward(self, self.fused_forward, x)" in compiled.source
    unfused = ("self.gemm = nn.Linear(in_features, out_features)\nself.pool = nn.AvgPool1d(3, stride=1)",
               "return torch.relu(self.pool(self.gemm(x).unsqueeze(1)).squeeze(1))")
    _, compiled, _ = _generate(tmp_path, *unfused, "unfused")
    assert any(r.kind == "torch" for r in compiled.regions)
    assert "replay_forward" not in compiled.source and "def forward(self, x):" in compiled.source
    # a Dropout: the training-mode forward keeps it a torch call (no graph), the eval-mode one is all fused
    dropout = ("self.gemm = nn.Linear(in_features, out_features)\nself.drop = nn.Dropout(0.0001)",
               "return torch.relu(self.drop(self.gemm(x)))")
    _, compiled, _ = _generate(tmp_path, *dropout, "dropout")
    assert ("            return self.forward_train(x)\n"
            "        return replay_forward(self, self.forward_eval, x)") in compiled.source


@requires_cuda
@pytest.mark.gpu
def test_gpu_replays_match_the_launches_and_track_changes(tmp_path, monkeypatch):
    prob, _, module = _generate(tmp_path, *FUSED, "fused_gpu", batch=200, k=300, n=199)
    ref, new = graphed_pair(prob, module, monkeypatch)
    x = torch.rand(200, 300, device="cuda")

    def check(got: torch.Tensor) -> None:
        with torch.no_grad():
            want = ref(x)
            launched = new.fused_forward(x)  # the launches, no graph
        assert torch.equal(got, launched)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()

    with torch.no_grad():
        outs = [new(x) for _ in range(3)]  # launches, capture + replay, replay
    entry = module._GRAPHS[new].graphs
    assert len(entry) == 1 and next(iter(entry.values())) is not None, "no graph was captured"
    for o in outs:
        check(o)
    kept = outs[-1].clone()
    with torch.no_grad():
        x.mul_(-2.0).add_(0.5)  # the same input tensor, new contents: replays read them
        check(new(x))
        assert torch.equal(outs[-1], kept), "a later call overwrote a result the caller kept"
        for m in (ref, new):
            m.gemm.weight.mul_(0.5)  # in place
        check(new(x)), check(new(x))
        w = torch.randn_like(ref.gemm.weight) * 0.05
        for m in (ref, new):
            m.gemm.weight = torch.nn.Parameter(w.clone())  # reassigned
        check(new(x)), check(new(x))
        for m in (ref, new):
            m.scaling_factor = -0.75  # a plain attribute
        check(new(x)), check(new(x))
    out = new(x)  # gradient mode: the autograd path, never a graph
    out.sum().backward()
    assert new.gemm.weight.grad is not None
