"""The accuracy contract rejects deliberately wrong ModelNews, rule by rule, and passes an honest one."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from kfuse import ops
from kfuse.cli import app
from kfuse.load import load_problem
from kfuse.verify import TOLERANCES, Reference, Results, check_contract, compare, run_in_process
from kfuse_testing import SEEDS, SMALL

P12 = load_problem(SEEDS / "12_gemm_multiply_leakyrelu.py", SMALL["12_gemm_multiply_leakyrelu"])
P39 = load_problem(SEEDS / "39_gemm_scale_batchnorm.py", SMALL["39_gemm_scale_batchnorm"])


def wrong(problem, forward):
    """A ModelNew subclassing the problem's Model whose forward is `forward(self, x, eager_output)`."""
    base = problem.model_cls

    class Wrong(base):
        def forward(self, x):
            return forward(self, x, base.forward(self, x))

    return Wrong


CASES = {
    "honest": (lambda self, x, y: y.clone(), None),
    "off_by_1e-3": (lambda self, x, y: y + 1e-3, "allclose"),
    "one_element": (lambda self, x, y: y.index_put((torch.tensor([3]), torch.tensor([5])), torch.tensor(9.0)),
                    "allclose"),
    "wrong_shape": (lambda self, x, y: y[:, :-1], "shape_dtype"),
    "wrong_dtype": (lambda self, x, y: y.double(), "shape_dtype"),
    "nan": (lambda self, x, y: y.index_put((torch.tensor([0]), torch.tensor([0])), torch.tensor(float("nan"))),
            "shape_dtype"),
    # within allclose's 1e-4 but far less accurate than fp32 eager: rule 3 catches it
    "tf32_like_noise": (lambda self, x, y: y + 3e-5 * torch.randn_like(y).sign(), "float64_bound"),
    "batch_specialized": (lambda self, x, y: y if x.shape[0] == 37 else y * 0, "extra_shape"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_contract_rules(case):
    forward, rule = CASES[case]
    rep = check_contract(P12, run_in_process(wrong(P12, forward)), device="cpu", trials=2)
    if rule is None:
        assert rep.correct, rep.failures
    else:
        assert not rep.correct and rep.rules[rule] is False, (rep.rules, rep.failures)
        assert rep.failures


def test_missed_running_stat_update_fails_buffers():
    base = P39.model_cls

    class NoUpdate(base):
        def forward(self, x):
            y = self.gemm(x) * self.scale
            return torch.nn.functional.batch_norm(y, None, None, self.bn.weight, self.bn.bias, True, 0.1, self.bn.eps)

    rep = check_contract(P39, run_in_process(NoUpdate), device="cpu", trials=1)
    assert not rep.correct and rep.rules["buffers"] is False and rep.rules["allclose"] is True


def test_optimize_refuses_to_write_a_failing_model(tmp_path, monkeypatch):
    """A kernel that is wrong (a bad table entry) gives exit 1, a report naming the rule, and no output file."""
    leaky = ops.POINTWISE["leaky_relu"]
    bad = leaky.__class__("leaky_relu", 2, "tl.where({0} >= 0.0, {0}, {0} * {1} * 1.01)",
                          "torch.nn.functional.leaky_relu({0}, {1})", leaky.ref)
    monkeypatch.setitem(ops.POINTWISE, "leaky_relu", bad)
    out, report = tmp_path / "new.py", tmp_path / "r.json"
    sets = [a for k, v in SMALL["12_gemm_multiply_leakyrelu"].items() for a in ("--set", f"{k}={v}")]
    res = CliRunner().invoke(app, ["optimize", str(SEEDS / "12_gemm_multiply_leakyrelu.py"), "--device", "cpu",
                                   "-o", str(out), "--json", str(report), "--trials", "2", *sets])
    assert res.exit_code == 1, res.output
    assert not out.exists()
    rep = json.loads(report.read_text())
    assert rep["correct"] is False and rep["output"] is None and rep["rules"]["allclose"] is False
    assert any("allclose" in f for f in rep["failures"])


def test_optimize_will_not_overwrite_a_users_file(tmp_path):
    out = tmp_path / "mine.py"
    out.write_text("precious = True\n")
    res = CliRunner().invoke(app, ["optimize", str(SEEDS / "12_gemm_multiply_leakyrelu.py"), "--device", "cpu",
                                   "-o", str(out), "--set", "batch_size=4"])
    assert res.exit_code == 2 and out.read_text() == "precious = True\n"


def test_a_buffer_equal_to_eagers_passes_where_eager_is_not_close_to_float64():
    """Rule 2 for buffers: eager's running variance 0.05 from float64 (a deep net's fp32 rounding) makes float64 the
    reference; a candidate that leaves eager's state passes, one as far off the other way fails."""
    f64 = torch.linspace(1.0, 2.0, 7, dtype=torch.float64)
    eager = (f64 + 0.05).float()
    ref = Reference(0, [], Results([torch.ones(3)], {"bn.running_var": eager}),
                    Results([torch.ones(3, dtype=torch.float64)], {"bn.running_var": f64}))
    tol = TOLERANCES["fp32"]
    same = compare(Results([torch.ones(3)], {"bn.running_var": eager.clone()}), ref, tol)
    assert same.rules["buffers"] and not same.failures
    other = compare(Results([torch.ones(3)], {"bn.running_var": (f64 - 0.05).float()}), ref, tol)
    assert other.rules["buffers"] is False and "not allclose to float64" in other.failures[0]
    # outputs keep the contract's rule 2 as written: float64 is the reference, eager's bits do not pass
    out_ref = Reference(0, [], Results([eager], {}), Results([f64], {}))
    assert compare(Results([eager.clone()], {}), out_ref, tol).rules["allclose"] is False
