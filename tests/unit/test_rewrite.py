"""Exact algebraic rewrites, device-free: each rule fires where it should, not where it should not, and the
rewritten graph (run as the torch code a fallback would emit) computes what the model computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kfuse.capture import capture
from kfuse.ir import Graph, Param, Scalar
from kfuse.ops import POINTWISE
from kfuse.rewrite import RULES, rewrite


def run_graph(g: Graph, model: nn.Module, inputs: list[torch.Tensor]):
    """Evaluate the graph node by node from each node's torch spelling (what a torch fallback emits)."""
    env: dict[str, object] = dict(zip(g.inputs, inputs))
    for n in g.nodes:
        code = n.fx_code
        if not code:
            args = [a.expr() if isinstance(a, (Param, Scalar)) else ("None" if a is None else a) for a in n.args]
            code = POINTWISE[n.op].torch_code(*args)
        env[n.name] = eval(code, {"torch": torch, "operator": __import__("operator"), "self": model}, env)
    outs = [env[o] for o in g.outputs]
    return outs[0] if len(outs) == 1 else tuple(outs)


class Wrap(nn.Module):
    def __init__(self, fn, k: int = 6, n: int = 5, bias: bool = True, **mods):
        super().__init__()
        self.lin = nn.Linear(k, n, bias=bias)
        self.w_kn = nn.Parameter(torch.randn(k, n))
        for name, m in mods.items():
            setattr(self, name, m)
        self.fn = fn

    def forward(self, x):
        return self.fn(self, x)


def rewritten(fn, check: bool = True, **kw):
    torch.manual_seed(0)
    model = Wrap(fn, **kw).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    g0 = capture(model, [x])
    g, applied = rewrite(g0)
    if check:  # in float64 the rewrites are exact up to rounding
        torch.testing.assert_close(run_graph(g, model, [x]), model(x), rtol=1e-12, atol=1e-12)
    return g, applied


def test_rule_names_are_unique_and_documented():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)) and all(r.doc for r in RULES)


def test_x_plus_x():
    g, applied = rewritten(lambda s, x: s.lin(x) + s.lin(x) * 0 + (lambda y: y + y)(s.lin(x)))
    assert "x+x->2x" in applied


def test_fold_scalar_mul_and_div():
    g, applied = rewritten(lambda s, x: (s.lin(x) * 3.0) / 4.0 * 2.0)
    assert applied.count("fold-scalar-mul") == 2
    mul = g.nodes[-1]
    assert mul.op == "mul" and mul.args[1] == Scalar(1.5)


def test_fold_scalar_add_sub():
    g, applied = rewritten(lambda s, x: (s.lin(x) + 1.0) - 0.25 + 2.0)
    assert applied.count("fold-scalar-add") == 2
    assert g.nodes[-1].op == "add" and g.nodes[-1].args[1] == Scalar(2.75)


def test_fold_keeps_values_read_twice_and_attributes():
    def fn(s, x):
        y = s.lin(x) * 3.0
        return y * 2.0 + y
    g, applied = rewritten(fn)
    assert "fold-scalar-mul" not in applied


@pytest.mark.parametrize("op, keepdim", [("sum", True), ("mean", False), ("amax", True), ("logsumexp", False)])
def test_reduce_over_size_one_is_identity(op, keepdim):
    def fn(s, x):
        y = s.lin(x).sum(dim=1, keepdim=True) * 2.0 + 1.0  # (M, 1), kept apart from the GEMM by the ops
        y = torch.sigmoid(y)
        return getattr(torch, op)(y, dim=1, keepdim=keepdim)
    g, applied = rewritten(fn)
    assert "reduce-size-1" in applied
    assert g.nodes[-1].op == "view" and g.nodes[-1].shape == ((4, 1) if keepdim else (4,))


def test_max_values_over_size_one():
    g, applied = rewritten(lambda s, x: torch.max(torch.sigmoid(s.lin(x)).sum(1, keepdim=True), dim=1)[0])
    assert "reduce-size-1" in applied


@pytest.mark.parametrize("op, value", [("softmax", 1.0), ("log_softmax", 0.0)])
def test_softmax_over_size_one_is_constant(op, value):
    g, applied = rewritten(lambda s, x: getattr(torch, op)(torch.sigmoid(s.lin(x)).mean(1, keepdim=True), dim=1))
    assert "reduce-size-1" in applied
    last = g.nodes[-1]
    assert last.op == "hardtanh" and last.args[1] == last.args[2] == Scalar(value)


def test_reduction_over_a_wide_dim_is_not_identity():
    g, applied = rewritten(lambda s, x: torch.sigmoid(s.lin(x)).sum(dim=1))
    assert "reduce-size-1" not in applied and g.nodes[-1].op == "sum"


def test_dropout_p0_is_identity_any_mode():
    g, applied = rewritten(lambda s, x: torch.relu(s.drop(s.lin(x))), drop=nn.Dropout(0.0))
    assert applied == ["dropout-p0"]
    g, applied = rewritten(lambda s, x: torch.relu(s.drop(s.lin(x))), check=False, drop=nn.Dropout(0.5))
    assert applied == [] and any(n.op == "dropout" for n in g.nodes)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("red", ["sum", "mean"])
@pytest.mark.parametrize("keepdim", [True, False])
def test_sum_of_linear_is_gemv(bias, red, keepdim):
    g, applied = rewritten(lambda s, x: getattr(torch, red)(s.lin(x), dim=1, keepdim=keepdim), bias=bias)
    assert applied == ["sum-of-gemm->gemv"]
    (node,) = g.nodes
    assert node.op == "linear_rowsum" and node.attrs["mean"] == (red == "mean")
    assert node.args[1] == Param("lin.weight", (5, 6)) and (node.args[2] is None) == (not bias)


def test_sum_of_kn_matmul_is_gemv():
    g, applied = rewritten(lambda s, x: (x @ s.w_kn).sum(dim=-1))
    assert applied == ["sum-of-gemm->gemv"] and g.nodes[0].attrs["kn"]


def test_sum_of_gemm_read_elsewhere_stays():
    def fn(s, x):
        y = s.lin(x)
        return y.sum(dim=1, keepdim=True) + y
    g, applied = rewritten(fn)
    assert "sum-of-gemm->gemv" not in applied


def test_sum_over_batch_dim_is_not_gemv():
    g, applied = rewritten(lambda s, x: s.lin(x).sum(dim=0))
    assert "sum-of-gemm->gemv" not in applied


def test_scale_moves_after_sum_then_gemv():
    g, applied = rewritten(lambda s, x: torch.sum(s.lin(x) / 2, dim=1, keepdim=True) * 1.5)
    assert applied == ["scale-after-sum", "sum-of-gemm->gemv", "fold-scalar-mul"]
    assert [n.op for n in g.nodes] == ["linear_rowsum", "mul"] and g.nodes[1].args[1] == Scalar(0.75)


def test_kernelbench_sum_max_mean_logsumexp_chain():
    def fn(s, x):
        x = torch.sum(s.lin(x), dim=1, keepdim=True)
        x = torch.max(x, dim=1, keepdim=True)[0]
        x = torch.mean(x, dim=1, keepdim=True)
        x = torch.logsumexp(x, dim=1, keepdim=True)
        return torch.logsumexp(x, dim=1, keepdim=True)
    g, applied = rewritten(fn)
    assert applied.count("reduce-size-1") == 4 and "sum-of-gemm->gemv" in applied
    assert [n.op for n in g.nodes if n.op != "view"] == ["linear_rowsum"]


def test_gelu_rewrite_free_graph_unchanged():
    g, applied = rewritten(lambda s, x: F.gelu(s.lin(x)) * 2.0)
    assert applied == [] and [n.op for n in g.nodes] == ["linear", "gelu", "mul"]


# ---- bn-eval-fold: eval-mode BatchNorm folded into the GEMM's weights when ModelNew runs ----------------
# The rule is applied by the generated launcher at call time (the mode and running statistics are known only
# then); here: its algebra (exact in float64) and where it applies. Interpreter tests: tests/test_norms.py.
from kfuse.kernels.batchnorm import batch_norm_fold  # noqa: E402
from kfuse.partition import partition  # noqa: E402
from kfuse.regions import call_time_rewrites  # noqa: E402
from kfuse.regions.gemm_batchnorm import FOLD_RULE, fold_plan  # noqa: E402


@pytest.mark.parametrize("kn, bias", [(False, True), (False, False), (True, False)])
@pytest.mark.parametrize("affine", [True, False])
def test_bn_fold_is_exact_in_float64(kn, bias, affine):
    """BN((x W^T + b) * s1 * s2) with running statistics == x W'^T + b' (float64 in, float64 out)."""
    g = torch.Generator().manual_seed(3)
    k, n, f64 = 6, 5, torch.float64

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=f64)

    w = rnd(k, n) if kn else rnd(n, k)
    b = rnd(n) if bias else None
    scales = (rnd(n), rnd(1))
    rm, rv = rnd(n) * 3, torch.rand(n, generator=g, dtype=f64) + 0.05
    gamma, beta = (rnd(n), rnd(n)) if affine else (None, None)
    x = rnd(4, k)
    y = (x @ w if kn else F.linear(x, w, b)) * scales[0] * scales[1]
    want = F.batch_norm(y, rm, rv, gamma, beta, False, 0.0, 1e-3)
    wf, bf = batch_norm_fold(w, b, scales, rm, rv, gamma, beta, 1e-3, kn)
    assert wf.shape == w.shape and wf.dtype == bf.dtype == f64 and bf.shape == (n,)
    torch.testing.assert_close(x @ wf + bf if kn else F.linear(x, wf, bf), want, rtol=1e-12, atol=1e-12)


def test_bn_fold_rounds_once_to_the_weights_dtype():
    """fp32 in: W' is the float64 product rounded once to fp32 (not fp32 arithmetic), b' fp32."""
    g = torch.Generator().manual_seed(4)
    w, rm, rv = torch.randn(7, 3, generator=g), torch.randn(7, generator=g), torch.rand(7, generator=g) + 0.1
    gamma, beta, s = torch.randn(7, generator=g), torch.randn(7, generator=g), torch.randn(7, generator=g)
    wf, bf = batch_norm_fold(w, None, (s,), rm, rv, gamma, beta, 1e-5, False)
    scale64 = s.double() * gamma.double() / torch.sqrt(rv.double() + 1e-5)
    assert wf.dtype == bf.dtype == torch.float32
    assert torch.equal(wf, (w.double() * scale64[:, None]).float())
    assert torch.equal(bf, (-rm.double() * gamma.double() / torch.sqrt(rv.double() + 1e-5) + beta.double()).float())


def bn_regions(fn, **mods):
    torch.manual_seed(0)
    model = Wrap(fn, **mods)
    g, _ = rewrite(capture(model, [torch.randn(4, 6)]))
    regions = partition(g)
    return [r for r in regions if r.kind == "gemm_batchnorm"], regions


@pytest.mark.parametrize("fn, bias, scales, kn", [
    (lambda s, x: s.bn(s.lin(x)), "lin.bias", [], False),
    (lambda s, x: torch.relu(s.bn(s.lin(x) * s.v)), "lin.bias", ["v"], False),
    (lambda s, x: s.bn(s.one * (s.lin(x) * s.v)), "lin.bias", ["v", "one"], False),
    (lambda s, x: torch.tanh(s.bn(x @ s.w_kn)), None, [], True),
])
def test_bn_fold_applies(fn, bias, scales, kn):
    (region,), regions = bn_regions(fn, bn=nn.BatchNorm1d(5), v=nn.Parameter(torch.randn(5)),
                                    one=nn.Parameter(torch.randn(1)))
    plan = fold_plan(region)
    assert plan is not None and plan.kn == kn
    assert (plan.bias.path if plan.bias else None) == bias and [p.path for p in plan.scales] == scales
    assert call_time_rewrites(regions) == [FOLD_RULE]


@pytest.mark.parametrize("why, fn, bn", [
    ("an activation before the norm", lambda s, x: s.bn(torch.relu(s.lin(x))), nn.BatchNorm1d(5)),
    ("an added vector before the norm", lambda s, x: s.bn(s.lin(x) + s.v), nn.BatchNorm1d(5)),
    ("the GEMM's output read outside", lambda s, x: (s.bn(y := s.lin(x)), torch.sigmoid(y)), nn.BatchNorm1d(5)),
    ("no running statistics", lambda s, x: s.bn(s.lin(x)), nn.BatchNorm1d(5, track_running_stats=False)),
])
def test_bn_fold_does_not_apply(why, fn, bn):
    (region,), regions = bn_regions(fn, bn=bn, v=nn.Parameter(torch.randn(5)))
    assert fold_plan(region) is None, why
    assert call_time_rewrites(regions) == []


def test_bn_fold_listed_in_report_of_problem_38():
    from kfuse.load import load_problem
    from kfuse.optimize import Options, compile_problem
    from kfuse_testing import ROOT
    prob = load_problem(ROOT / "problems/gemm/38_gemm_batchnorm_eval_relu.py",
                        {"batch_size": 37, "in_features": 70, "out_features": 129})
    compiled = compile_problem(prob, Options(device="cpu"))
    assert compiled.rewrites == [FOLD_RULE]
    assert "bn_eval_fold(" in compiled.source and "_eval_kernel" not in compiled.source


def softmax_rows_graph(fn, shape=(2, 3, 4, 5)):
    """capture and rewrite fn(x) on a 4-d input; the rewritten graph checked against fn in float64."""
    class M(nn.Module):
        def forward(self, x):
            return fn(x)
    model = M()
    x = torch.randn(*shape, dtype=torch.float64)
    g, applied = rewrite(capture(model, [x]))
    torch.testing.assert_close(run_graph(g, model, [x]), model(x), rtol=1e-12, atol=1e-12)
    return g, applied


def test_softmax_over_a_view_flattening_trailing_dims_is_one_node():
    g, applied = softmax_rows_graph(lambda x: torch.softmax(x.view(x.shape[0], x.shape[1], -1), 2).view(x.shape))
    assert "softmax-rows" in applied
    rows = next(n for n in g.nodes if n.op == "softmax_rows")
    assert rows.attrs["dims"] == 2 and not any(n.op in ("softmax", "view") for n in g.nodes)
    g, applied = softmax_rows_graph(lambda x: F.log_softmax(x.reshape(x.shape[0], -1), -1).reshape(x.shape))
    assert next(n for n in g.nodes if n.op == "log_softmax_rows").attrs["dims"] == 3


@pytest.mark.parametrize("fn", [
    lambda x: torch.softmax(x.view(-1, x.shape[-1]), -1).view(x.shape),  # over one dim: no views needed
    lambda x: torch.softmax(x.view(x.shape[0], -1), 0).view(x.shape),  # not over the view's last dim
    lambda x: torch.softmax(x.view(x.shape[0], -1), 1),  # not viewed back
    lambda x: (lambda v: (torch.softmax(v, 1).view(x.shape), v))(x.view(x.shape[0], -1)),  # the view read twice
])
def test_softmax_rows_does_not_fire(fn):
    _, applied = softmax_rows_graph(fn)
    assert "softmax-rows" not in applied


class NormMean(nn.Module):
    def __init__(self, dims, keepdim):
        super().__init__()
        self.conv, self.gn = nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4)
        self.dims, self.keepdim = dims, keepdim

    def forward(self, x):
        return self.gn(self.conv(x)).mean(dim=self.dims, keepdim=self.keepdim)


@pytest.mark.parametrize("dims, keepdim", [([1, 2, 3], False), ((-1, -3, -2), True)])
def test_a_mean_over_channels_and_space_is_split(dims, keepdim):
    model = NormMean(dims, keepdim).double()
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64)
    g, applied = rewrite(capture(model, [x]))
    assert "mean-space-then-channels" in applied
    spatial, channels = [n for n in g.nodes if n.op in ("mean_dims", "mean")]
    assert spatial.attrs["dims"] == (2, 3) and channels.attrs["dim"] == 1 and channels.args == (spatial.name,)
    assert spatial.shape == ((2, 4, 1, 1) if keepdim else (2, 4))
    torch.testing.assert_close(run_graph(g, model, [x]), model(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", [
    lambda x: x.mean(dim=[1, 2, 3]),  # a model input: no conv or norm made it
    lambda x: torch.relu(x).mean(dim=[1, 2, 3]),  # a pointwise op made it
    lambda x: nn.functional.group_norm(x, 1).mean(dim=[2, 3]),  # over the spatial dims alone: the kinds take it
    lambda x: nn.functional.group_norm(x, 1).mean(dim=[0, 1, 2, 3]),  # over the batch too
])
def test_the_mean_split_does_not_fire(fn):
    class M(nn.Module):
        def forward(self, x):
            return fn(x)
    _, applied = rewrite(capture(M(), [torch.randn(2, 3, 4, 5)]))
    assert "mean-space-then-channels" not in applied


def test_matvec_rewrite_runs_as_torch_code():
    """A @ v becomes a (1, K) row against A: where no GEMM kind takes it (--backend cuda: A is a value, not a
    parameter), the row's product is a torch call, so each new node has a torch spelling."""
    class M(nn.Module):
        def forward(self, a, v):
            return torch.matmul(a, v)
    model = M()
    a, v = torch.randn(40, 7, dtype=torch.float64), torch.randn(7, 1, dtype=torch.float64)
    g, applied = rewrite(capture(model, [a, v]))
    assert "matvec->skinny" in applied and all(n.fx_code for n in g.nodes)
    torch.testing.assert_close(run_graph(g, model, [a, v]), model(a, v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", [
    lambda x: torch.multiply(torch.tanh(F.softplus(x)), x),  # KernelBench level 2 52's spelling
    lambda x: x * torch.tanh(F.softplus(x, beta=1.0, threshold=20.0)),
])
def test_mish_written_out_is_one_node(fn):
    class M(nn.Module):
        def forward(self, x):
            return fn(x)
    model = M()
    x = torch.randn(3, 4, 5, dtype=torch.float64) * 10.0  # some past softplus's threshold
    g, applied = rewrite(capture(model, [x]))
    assert "mish" in applied and [n.op for n in g.nodes] == ["mish"]
    torch.testing.assert_close(run_graph(g, model, [x]), model(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", [
    lambda x: x * torch.tanh(F.softplus(x, beta=2.0)),  # not softplus's defaults
    lambda x: torch.relu(x) * torch.tanh(F.softplus(x)),  # another value times it
    lambda x: (lambda t: (x * t, t))(torch.tanh(F.softplus(x))),  # the tanh read twice
])
def test_mish_rewrite_does_not_fire(fn):
    class M(nn.Module):
        def forward(self, x):
            return fn(x)
    _, applied = rewrite(capture(M(), [torch.randn(2, 3)]))
    assert "mish" not in applied
