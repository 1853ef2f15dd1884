"""Dropout and the mode of the model (kfuse/modes.py): in eval mode Dropout is the identity and fuses away; in
training mode it stays a torch call (torch draws the mask). ModelNew carries both forwards and picks one by
the Dropouts' `training` flags; each is checked against eager in its mode (same seed: the same masks)."""

from __future__ import annotations

import re

import pytest
import torch

from kfuse.gradients import gradient_contract
from kfuse.load import load_problem
from kfuse.optimize import Options, load_module, optimize, report
from kfuse_testing import generate_model, graphed_pair, requires_cuda, write_problem

CPU = Options(device="cpu", trials=2)
LINEAR = "self.lin = nn.Linear(in_features, out_features)"


def _compile(tmp_path, init: str, forward: str, name: str):
    return generate_model(tmp_path, f"{LINEAR}\n{init}", forward, name, n=72)


def _outputs_match(prob, module, mode: str, seed: int = 3) -> None:
    torch.manual_seed(0)
    ref = prob.build()
    new = prob.build(cls=module.ModelNew)
    new.load_state_dict(ref.state_dict())
    x = prob.inputs()
    for m in (ref, new):
        getattr(m, mode)()
    with torch.no_grad():
        torch.manual_seed(seed)
        want = ref(*x)
        torch.manual_seed(seed)
        got = new(*x)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_eval_mode_dropout_fuses_away_and_training_mode_keeps_it(tmp_path):
    """Problem 41's pattern: constructed in eval mode, so the checked forward is the eval one (one region, no
    torch call); switched to train(), the other forward draws torch's masks (outputs and gradients as eager's)."""
    init = "self.drop = nn.Dropout(0.3)\nself.eval()"
    path = write_problem(tmp_path, f"{LINEAR}\n{init}", "return self.drop(torch.softmax(self.lin(x), dim=1)) * 2.0",
                         n=72, name="eval_drop")
    prob = load_problem(path)
    result = optimize(prob, CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    c = result.compiled
    assert c.mode == "eval" and c.unfused == [] and "dropout-eval" in c.rewrites
    assert [(r.kind, r.ops()) for r in c.regions] == [("gemm_rowreduce", ["linear", "softmax", "view", "mul"])]
    rep = report(prob, CPU, result, None)
    assert rep["mode"] == "eval" and set(rep["modes"]) == {"train", "eval"}
    assert rep["modes"]["train"]["unfused_ops"] == ["nn.Dropout drop", "operator.mul"]
    module = load_module(result.candidate_path)
    for mode in ("train", "eval", "train"):
        _outputs_match(prob, module, mode)
    for train in (True, False):
        verdict = gradient_contract(prob, module.ModelNew, train=train)
        assert verdict.correct, verdict.failures


def test_training_mode_model_reports_the_torch_dropout_and_fuses_it_in_eval(tmp_path):
    """Problem 19's pattern: constructed in training mode, the checked forward keeps Dropout a torch call; in
    eval() the ops after it join the GEMM's region."""
    prob, c, module = _compile(tmp_path, "self.drop = nn.Dropout(0.5)",
                               "return torch.mean(self.drop(self.lin(x)), dim=1, keepdim=True)", "train_drop")
    assert c.mode == "train" and c.unfused == ["nn.Dropout drop", "torch.mean"]
    eval_forward = next(v for v in c.variants if v.mode == "eval")
    assert [r.kind for r in eval_forward.regions] == ["gemm_rowreduce"] and eval_forward.unfused == []
    for mode in ("eval", "train"):
        _outputs_match(prob, module, mode)


def test_functional_dropout_flags(tmp_path):
    """F.dropout(x, p, training=self.training) follows the mode (found by capturing in both modes);
    F.dropout(x, p) is active in eval mode too (one forward, as eager); training=False is the identity."""
    prob, c, module = _compile(tmp_path, "", "return torch.relu(F.dropout(self.lin(x), 0.5, training=self.training))",
                               "follows")
    assert {v.mode for v in c.variants} == {"train", "eval"}
    assert "if self.training:" in c.source
    for mode in ("eval", "train"):
        _outputs_match(prob, module, mode)
    prob, c, module = _compile(tmp_path, "", "return torch.relu(F.dropout(self.lin(x), 0.5))", "always")
    assert [v.mode for v in c.variants] == ["any"] and c.unfused == ["torch.nn.functional.dropout", "torch.relu"]
    for mode in ("eval", "train"):
        _outputs_match(prob, module, mode)
    prob, c, module = _compile(tmp_path, "", "return torch.relu(F.dropout(self.lin(x), 0.5, training=False))", "off")
    assert [v.mode for v in c.variants] == ["any"] and c.unfused == [] and "dropout-off" in c.rewrites
    _outputs_match(prob, module, "train")


@pytest.mark.parametrize("drop", [False, True])
def test_two_layers_with_the_same_ops_get_their_own_kernels(tmp_path, drop):
    """Kernel and launcher names come from the ops: the second Linear -> ReLU layer (and, with a Dropout, the
    eval forward's regions) get suffixed names, each defined once and called by its own Function."""
    init = "self.lin2 = nn.Linear(out_features, out_features)\nself.drop = nn.Dropout(0.2)"
    inner = "self.drop(torch.relu(self.lin(x)))" if drop else "torch.relu(self.lin(x))"
    prob, c, module = _compile(tmp_path, init, f"return torch.relu(self.lin2({inner}))", f"twin{int(drop)}")
    defs = re.findall(r"^def (\w+)\(", c.source, re.M)
    assert len(defs) == len(set(defs)), sorted(d for d in defs if defs.count(d) > 1)
    assert "def fused_linear_relu_2(" in c.source and "= fused_linear_relu_2(" in c.source
    for mode in ("eval", "train"):
        _outputs_match(prob, module, mode)
    for train in (True, False):  # the renamed dZ kernels too
        verdict = gradient_contract(prob, module.ModelNew, train=train)
        assert verdict.correct, verdict.failures


@requires_cuda
@pytest.mark.gpu
def test_gpu_mode_switches_with_graphed_eval_forward(tmp_path, monkeypatch):
    """Compiled, problem 41's pattern at odd sizes: eval calls replay the graphed eval forward (every graph kept),
    train() calls run forward_train (torch's masks, as eager's with the same seed), and back in eval the
    graph again; each call against eager in the same mode."""
    init = "self.drop = nn.Dropout(0.3)\nself.eval()"
    prob, _, module = generate_model(tmp_path, f"{LINEAR}\n{init}",
                                     "return self.drop(torch.softmax(self.lin(x), dim=1)) * 2.0", "gpu_drop", "cuda",
                                     batch=200, k=300, n=199)
    ref, new = graphed_pair(prob, module, monkeypatch)
    x = torch.rand(200, 300, device="cuda")
    for step, mode in enumerate(("eval", "eval", "eval", "train", "train", "eval", "eval")):
        for m in (ref, new):
            getattr(m, mode)()
        with torch.no_grad():
            torch.manual_seed(step)
            want = ref(x)
            torch.manual_seed(step)
            got = new(x)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        if mode == "train":
            assert (got == 0).any()  # the mask was drawn
    assert module.graph_kept(new)
