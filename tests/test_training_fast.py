"""The faster backward (docs/training.md, benchmarks/train/NOTES.md): z kept from the forward kernel, the fused
dZ kernel for pointwise epilogues, the backward GEMMs' operand preparation. CPU interpreter, odd sizes
(37 x 70 -> 129); GPU tests marked `gpu`."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from kfuse.gradients import gradient_contract as kfuse_contract
from kfuse.gradients import run_backward
from kfuse.load import load_problem
from kfuse_testing import SEEDS, SMALL, write_problem
from test_training import compile_to, gradient_contract, pair, region_problem


def no_recompute(module, monkeypatch) -> list:
    """Make the generated file's z recomputation record its calls (the saved z should make it unneeded)."""
    calls = []
    orig = module.FusedGemmFn.recompute_z

    def counting(*a):
        calls.append(1)
        return orig(*a)
    monkeypatch.setattr(module.FusedGemmFn, "recompute_z", staticmethod(counting))
    return calls


@pytest.mark.parametrize("case", ["epilogue_mul_leaky", "epilogue_two_outputs", "matmul_no_bias", "groupnorm",
                                  "groupnorm_wide", "batchnorm_scale"])
def test_forward_keeps_z(tmp_path, monkeypatch, case):
    """Training-mode backward uses the z the forward kernel stored: no GEMM recomputed, gradients in contract."""
    prob = region_problem(tmp_path, case)
    compiled, module = compile_to(prob, tmp_path)
    assert "def launch_z(" in compiled.source
    calls = no_recompute(module, monkeypatch)
    gradient_contract(prob, module, train=True, draws=1)
    assert not calls


def test_batchnorm_eval_recomputes_z(tmp_path, monkeypatch):
    """Eval mode folds the BatchNorm into W (no z formed): backward falls back to recomputing z, still exact."""
    prob = region_problem(tmp_path, "batchnorm_scale")
    _, module = compile_to(prob, tmp_path)
    calls = no_recompute(module, monkeypatch)
    gradient_contract(prob, module, train=False, draws=1)
    assert calls


@pytest.mark.parametrize("name", sorted(SMALL))
def test_saved_z_is_the_gemm_output(tmp_path, name):
    """The z a launcher returns with save_z=True is x W^T + b (fp32 accurate), and the outputs are unchanged."""
    prob = load_problem(SEEDS / f"{name}.py", SMALL[name])
    _, module = compile_to(prob, tmp_path)
    _, new, _ = pair(prob, module)
    new.train()
    fn = next(module.autograd_fn(v) for k, v in vars(module).items()
              if k.endswith("Fn") and getattr(v, "launch_z", None))
    x = prob.inputs()[0]
    with torch.no_grad():
        outs, (z, *_) = fn.launch_z(new, x)  # kept: z, then x's split where the GEMM made one
        plain = fn.launch(new, x)
    lin = next(m for m in new.modules() if isinstance(m, torch.nn.Linear))
    want = x.double() @ lin.weight.double().t() + lin.bias.double()
    assert z.dtype == x.dtype and z.shape == want.shape
    torch.testing.assert_close(z.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0], plain if torch.is_tensor(plain) else plain[0], atol=1e-6, rtol=1e-6)


# ---- the fused epilogue backward (kfuse/backward_epilogue.py) --------------------------------------------
LIN = "self.lin = nn.Linear(in_features, out_features)"
PARAMS = LIN + "\nself.s = nn.Parameter(torch.rand(out_features) + 0.5)\nself.a = nn.Parameter(torch.tensor(1.5))"
DZ_CASES = {  # together they use every row of DERIVATIVES, column and single parameters, a detach, two outputs
    "abs_neg_div_exp": (PARAMS, "y = self.lin(x)\nreturn torch.abs(-y) / self.s - torch.exp(y * 0.1) * self.a"),
    "hard_clamps": (LIN, "y = self.lin(x)\n"
                    "return F.hardswish(y) + F.hardsigmoid(y) * torch.clamp(y, min=-0.5) - torch.clamp(y, max=0.3)"),
    "smooth": (LIN, "y = self.lin(x)\n"
               "return F.softplus(y, beta=2.0, threshold=1.0) + F.mish(y) + F.silu(y) + F.gelu(y)"),
    "kinks": (LIN, "y = self.lin(x) * 3.0\n"
              "return torch.tanh(y) * torch.sigmoid(y) + F.hardtanh(y, -0.5, 0.5) + torch.relu(y)"
              " - F.leaky_relu(y, 0.2)"),
    "square_detach_two_outputs": (PARAMS, "y = self.lin(x)\nd = y.clone().detach()\nu = y * y * self.s + d\n"
                                  "return u, u - y * self.a"),
}


def _fns(module) -> list:
    return [module.autograd_fn(v) for k, v in vars(module).items()
            if k.endswith("Fn") and getattr(v, "fused_dz", None)]


def fused_dz_and_float64_reference(fn, model, x, state=None) -> tuple:
    """(dz, db, pairs) from the Function's generated dZ kernel for a random upstream gradient, and torch autograd
    of the region's own epilogue in float64 on the same saved z: (d z, then d each parameter in `pairs`).
    `state`: what the epilogue reads as the forward saw it (BatchNorm's), None where it reads none."""
    m64 = copy.deepcopy(model).double()
    with torch.no_grad():
        outs, (z, *_) = fn.launch_z(model, x)
    grads = tuple(torch.randn_like(o) for o in outs)
    dz, db, pairs, amax = fn.fused_dz(model, z, grads)
    assert torch.equal(amax, dz.abs().amax(0)), "the dZ kernel's column maxima of |dZ|"
    z64 = z.double().requires_grad_(True)
    p64 = dict(m64.named_parameters())
    names = {id(p): k for k, p in model.named_parameters()}
    ref_outs = fn.epilogue(m64, state, lambda t: t, z64)
    ref_outs = ref_outs if isinstance(ref_outs, tuple) else (ref_outs,)
    wrt = [z64] + [p64[names[id(p)]] for p, _ in pairs]
    ref = torch.autograd.grad(ref_outs, wrt, [g.double() for g in grads], allow_unused=True)
    return dz, db, pairs, ref


def assert_norm_parameter_grads(model, norm_type, pairs, ref) -> None:
    """The dZ kernel gave the norm's gamma and beta gradients, and every parameter's float64 gradient (pairs)
    equals the float64 reference's (ref[1:], None: zero) to 1e-12."""
    norm = next(m for m in model.modules() if isinstance(m, norm_type))
    affine = [t for t in (norm.weight, norm.bias) if t is not None]
    assert all(any(p is t for p, _ in pairs) for t in affine)  # gamma's and beta's gradients from the kernel
    for (p, g), r in zip(pairs, ref[1:]):
        assert g.dtype == torch.float64 and g.shape == p.shape
        torch.testing.assert_close(g, r if r is not None else torch.zeros_like(g), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("case", sorted(DZ_CASES))
def test_fused_dz_matches_float64_autograd(tmp_path, case):
    """The generated dZ kernel against torch autograd of the region's own float64 epilogue, same z: dZ to the
    last fp32 bit, db and the parameter gradients to float64 rounding."""
    init, forward = DZ_CASES[case]
    prob = load_problem(write_problem(tmp_path, init, forward, name=case))
    compiled, module = compile_to(prob, tmp_path)
    assert [r.kind for r in compiled.regions] == ["gemm_epilogue"]
    (fn,) = _fns(module)
    torch.manual_seed(3)
    model = prob.build(cls=module.ModelNew)
    dz, db, pairs, ref = fused_dz_and_float64_reference(fn, model, prob.inputs()[0])
    torch.testing.assert_close(dz, ref[0].float(), atol=1e-30, rtol=3e-7)
    torch.testing.assert_close(db, ref[0].sum(0), atol=1e-10, rtol=1e-10)
    assert bool(pairs) == ("self.s" in init)  # the parameters' gradients come from the kernel
    for (p, g), r in zip(pairs, ref[1:]):
        assert g.dtype == torch.float64 and g.shape == p.shape
        torch.testing.assert_close(g, r if r is not None else torch.zeros_like(g), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("case", sorted(DZ_CASES))
def test_fused_dz_gradients_meet_contract(tmp_path, case):
    init, forward = DZ_CASES[case]
    prob = load_problem(write_problem(tmp_path, init, forward, name=case))
    _, module = compile_to(prob, tmp_path)
    assert _fns(module)
    gradient_contract(prob, module, train=True, draws=2)


def test_epilogues_without_a_derivative_row_use_torch(tmp_path):
    """An op without a DERIVATIVES row (tanh-GELU) keeps the float64 torch epilogue backward."""
    prob = load_problem(write_problem(tmp_path, LIN, "return F.gelu(self.lin(x), approximate='tanh')", name="gt"))
    compiled, module = compile_to(prob, tmp_path)
    assert compiled.regions[0].kind == "gemm_epilogue" and not _fns(module)
    gradient_contract(prob, module, train=True, draws=1)


# ---- the fused GroupNorm backward (kfuse/backward_groupnorm.py) ------------------------------------------
GEMM = Path(__file__).resolve().parent.parent / "problems" / "gemm"
GN = "self.lin = nn.Linear(in_features, out_features)\nself.s = nn.Parameter(torch.rand(out_features) + 0.5)\n"
GN_CASES = {  # name: (problem file or (init, forward), size overrides); channels per group in the comment
    "62": (SEEDS / "62_matmul_groupnorm_leakyrelu_sum.py", SMALL["62_matmul_groupnorm_leakyrelu_sum"]),  # 16
    "62_g8": (SEEDS / "62_matmul_groupnorm_leakyrelu_sum.py", {"batch_size": 37, "input_size": 70,
                                                               "hidden_size": 256, "num_groups": 32}),
    "08_g4": (GEMM / "08_gemm_groupnorm_hardtanh.py", {"out_features": 128, "num_groups": 32}),  # 4, after
    "08_g128": (GEMM / "08_gemm_groupnorm_hardtanh.py", {"out_features": 256, "num_groups": 2}),  # 128
    "09_g8": (GEMM / "09_matmul_swish_biasadd_groupnorm.py", {"out_features": 256, "num_groups": 32}),  # before
    "09_g4_masked": (GEMM / "09_matmul_swish_biasadd_groupnorm.py", {"out_features": 72, "num_groups": 18}),
    "27_g32": (GEMM / "27_gemm_groupnorm_swish_multiply_swish.py", {"out_features": 256, "num_groups": 8}),
    "27_g64_masked": (GEMM / "27_gemm_groupnorm_swish_multiply_swish.py", {"out_features": 192, "num_groups": 3}),
    "28_g64": (GEMM / "28_gemm_biasadd_hardtanh_mish_groupnorm.py", {"out_features": 128, "num_groups": 2}),
    # affine=False, a parameter read before and after the norm, a residual of z past the norm: 16
    "no_affine_residual": ((GN + "self.gn = nn.GroupNorm(8, out_features, affine=False)",
                            "y = self.lin(x)\nreturn torch.tanh(self.gn(y * self.s + 0.5)) * self.s + y"), {}),
    # two outputs, the norm's own and one after it: 32
    "two_outputs": ((GN + "self.gn = nn.GroupNorm(4, out_features)",
                     "u = self.gn(F.silu(self.lin(x)))\nreturn u, F.gelu(u) / self.s"), {}),
}


def gn_problem(tmp_path: Path, case: str):
    src, sizes = GN_CASES[case]
    if isinstance(src, Path):
        return load_problem(src, sizes if src.parent == SEEDS else {"batch_size": 37, "in_features": 70} | sizes)
    return load_problem(write_problem(tmp_path, *src, n=128, name=case))


def gn_module(tmp_path: Path, case: str):
    """The problem, its compiled module and its one GroupNorm Function, which must have the fused dZ."""
    prob = gn_problem(tmp_path, case)
    compiled, module = compile_to(prob, tmp_path)
    assert [r.kind for r in compiled.regions] == ["gemm_groupnorm"]
    (fn,) = _fns(module)
    return prob, module, fn


def perturbed(prob, cls):
    """The model with every parameter moved off its init (GroupNorm's gamma 1, beta 0 would hide errors)."""
    torch.manual_seed(5)
    model = prob.build(cls=cls)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize("case", sorted(GN_CASES))
def test_groupnorm_fused_dz_matches_float64_autograd(tmp_path, case):
    """The generated GroupNorm dZ kernel against torch autograd of the region's float64 epilogue (the torch
    path's math), same z: dZ to its one fp32 rounding, db, gamma, beta and the other parameters' float64
    gradients to 1e-12."""
    prob, module, fn = gn_module(tmp_path, case)
    model = perturbed(prob, module.ModelNew)
    dz, db, pairs, ref = fused_dz_and_float64_reference(fn, model, prob.inputs()[0])
    torch.testing.assert_close(dz, ref[0].float(), atol=1e-30, rtol=3e-7)
    torch.testing.assert_close(db, ref[0].sum(0), atol=1e-12, rtol=1e-12)
    assert_norm_parameter_grads(model, torch.nn.GroupNorm, pairs, ref)


def _model_grads(prob, module, fused: bool, monkeypatch) -> dict:
    """x's and every parameter's gradient (fp32) from one training step, with the fused dZ or without it."""
    fn = _fns(module)[0]
    with monkeypatch.context() as m:
        if not fused:
            m.setattr(fn, "fused_dz", None)
        model = perturbed(prob, module.ModelNew)
        got = run_backward(model, prob.inputs(), torch.float32, seed=11)
    return {k: v for k, v in got.items() if k.endswith(".grad")}


def _contract_errors(prob, module, fused: bool, monkeypatch) -> dict[str, float]:
    with monkeypatch.context() as m:
        if not fused:
            m.setattr(_fns(module)[0], "fused_dz", None)
        return kfuse_contract(prob, module.ModelNew, train=True, draws=1).errors


@pytest.mark.parametrize("case", sorted(GN_CASES))
def test_groupnorm_fused_dz_matches_torch_backward(tmp_path, monkeypatch, case):
    """Every gradient (x, W, b, gamma, beta, other parameters) through the fused dZ equals the float64 torch
    path's (the fallback) up to fp32 rounding, and lies as close to float64 as that path's."""
    prob, module, _ = gn_module(tmp_path, case)
    fused, torch_path = (_model_grads(prob, module, f, monkeypatch) for f in (True, False))
    assert fused.keys() == torch_path.keys() and "input0.grad" in fused
    for k, want in torch_path.items():
        # dZ rounds to fp32 once either way (a value on a rounding tie may land one ulp apart, dX and dW then
        # move by about that ulp times |W| or |X|); the torch path rounds a parameter's gradient once per read
        # of it (`cast` per use) and adds in fp32, the kernel once: a parameter read twice (s) differs by that
        torch.testing.assert_close(fused[k], want, atol=1e-6 * want.abs().max().item(), rtol=1e-6, msg=k)
    errs, torch_errs = (_contract_errors(prob, module, f, monkeypatch) for f in (True, False))
    for k, e in errs.items():
        assert e <= 1.01 * torch_errs[k] + 1e-9, (k, e, torch_errs[k])


@pytest.mark.parametrize("forward", ["y = self.lin(x)\nreturn F.gelu(self.gn(y), approximate='tanh')",
                                     "y = self.lin(x)\nreturn self.gn(F.gelu(y, approximate='tanh'))"])
def test_groupnorm_without_a_derivative_row_uses_torch(tmp_path, forward):
    """An op without a DERIVATIVES row (tanh-GELU) before or after the norm: no kernel, the float64 torch
    backward, gradients in contract."""
    prob = load_problem(write_problem(tmp_path, LIN + "\nself.gn = nn.GroupNorm(8, out_features)", forward,
                                      n=128, name="gt"))
    compiled, module = compile_to(prob, tmp_path)
    assert [r.kind for r in compiled.regions] == ["gemm_groupnorm"] and not _fns(module)
    gradient_contract(prob, module, train=True, draws=1)


# ---- the fused training-mode BatchNorm backward (kfuse/backward_batchnorm.py) ----------------------------
TILED = {"batch_size": 150, "in_features": 70, "out_features": 129}  # 3 row tiles of 64 (interpreter), last partial
BN_CASES = {  # name: (problem file or (init, forward, batch), size overrides)
    "39": (SEEDS / "39_gemm_scale_batchnorm.py", SMALL["39_gemm_scale_batchnorm"]),  # a scale before the norm
    "39_tiles": (SEEDS / "39_gemm_scale_batchnorm.py", TILED),
    "11": (GEMM / "11_gemm_batchnorm_groupnorm_gelu_mean_relu.py", {"out_features": 128, "num_groups": 8}),
    "25": (GEMM / "25_gemm_batchnorm_scaling_softmax.py", {"out_features": 129}),  # a 1-element scale after
    "30_tiles": (GEMM / "30_matmul_batchnorm_biasadd_divide_swish.py", TILED | {"divide_value": 1.7}),
    # affine=False, momentum None, a parameter read before and after the norm
    "no_affine": ((GN + "self.bn = nn.BatchNorm1d(out_features, affine=False, momentum=None)",
                   "y = self.lin(x)\nreturn torch.tanh(self.bn(F.silu(y) * self.s + 0.5)) * self.s", 150), {}),
    # no running statistics, two outputs (the norm's own and one after it)
    "no_running_stats": ((GN + "self.bn = nn.BatchNorm1d(out_features, track_running_stats=False)",
                          "u = self.bn(torch.relu(self.lin(x)) * self.s)\nreturn u, F.gelu(u) / self.s", 100), {}),
}


def bn_module(tmp_path: Path, case: str):
    """The problem, its compiled module and its one GEMM + BatchNorm Function, which must have the fused dZ."""
    src, sizes = BN_CASES[case]
    if isinstance(src, Path):
        prob = load_problem(src, sizes if src.parent == SEEDS else {"batch_size": 37, "in_features": 70} | sizes)
    else:
        init, forward, batch = src
        prob = load_problem(write_problem(tmp_path, init, forward, batch=batch, name=case))
    compiled, module = compile_to(prob, tmp_path)
    assert compiled.regions[0].kind == "gemm_batchnorm"
    (fn,) = _fns(module)
    return prob, module, fn


@pytest.mark.parametrize("case", sorted(BN_CASES))
def test_batchnorm_fused_dz_matches_float64_autograd(tmp_path, case):
    """The generated BatchNorm dZ kernel (three phases, or two) against torch autograd of the region's float64 epilogue
    with batch statistics (the torch path's math), same z: dZ to its one fp32 rounding, gamma, beta and the
    other parameters' float64 gradients to 1e-12; db (zero in exact arithmetic: the norm removes each
    column's mean) to float64 noise."""
    prob, module, fn = bn_module(tmp_path, case)
    # the norm last in its region (39; 11, whose GroupNorm is a region of its own): the statistics passes merge
    # into one (backward_batchnorm.batchnorm_reverse)
    text = Path(module.__file__).read_text()
    assert ("bn_merged=True" in text) == (case in ("39", "39_tiles", "11"))
    assert "mean_ptr + tile" not in text and "rstd_ptr + tile" not in text  # (N,) vectors, never read as tiles
    model = perturbed(prob, module.ModelNew)
    state = fn.state(model)
    assert module.batch_statistics(state)
    dz, db, pairs, ref = fused_dz_and_float64_reference(fn, model, prob.inputs()[0], state)
    torch.testing.assert_close(dz, ref[0].float(), atol=1e-30, rtol=3e-7)
    torch.testing.assert_close(db, ref[0].sum(0), atol=1e-13 * ref[0].abs().max().item(), rtol=1e-12)
    assert_norm_parameter_grads(model, torch.nn.BatchNorm1d, pairs, ref)


@pytest.mark.parametrize("case", ["39", "25", "no_running_stats"])
def test_batchnorm_training_forward_from_z_matches_the_plain_launch(tmp_path, case):
    """A training forward that keeps z for backward writes z alone and its apply pass runs the ops before the
    norm again from z (FROM_Z): outputs and running statistics equal the plain launch's bit for bit."""
    prob, module, fn = bn_module(tmp_path, case)
    assert "FROM_Z=from_z" in Path(module.__file__).read_text()
    plain = perturbed(prob, module.ModelNew)
    keeping = copy.deepcopy(plain)
    x = prob.inputs()[0]
    with torch.no_grad():
        outs = fn.launch(plain, x)
        kept_outs, (z, *_) = fn.launch_z(keeping, x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert z is not None and len(outs) == len(kept_outs)
    for a, b in zip(outs, kept_outs):
        assert torch.equal(a, b)
    for a, b in zip(plain.buffers(), keeping.buffers()):
        assert torch.equal(a, b)


def _counting_dz(fn, monkeypatch) -> list:
    """Record the calls of fn's fused dZ (did backward use the kernel?)."""
    calls, orig = [], fn.fused_dz

    def counting(*a):
        calls.append(1)
        return orig(*a)
    monkeypatch.setattr(fn, "fused_dz", staticmethod(counting))
    return calls


@pytest.mark.parametrize("case", sorted(BN_CASES))
def test_batchnorm_fused_dz_matches_torch_backward(tmp_path, monkeypatch, case):
    """A training step through the fused dZ (used: counted): every gradient (x, W, b, gamma, beta, other
    parameters) equals the float64 torch path's up to fp32 rounding (b's, zero in exact arithmetic, to the
    noise of a sum of dZ), the running statistics equal eager's, and the contract errors are the torch
    path's."""
    prob, module, fn = bn_module(tmp_path, case)
    torch_path = _model_grads(prob, module, False, monkeypatch)
    calls = _counting_dz(fn, monkeypatch)
    fused = _model_grads(prob, module, True, monkeypatch)
    assert calls and fused.keys() == torch_path.keys() and "input0.grad" in fused
    scale = max(v.abs().max().item() for v in torch_path.values())
    for k, want in torch_path.items():
        torch.testing.assert_close(fused[k], want, atol=1e-6 * want.abs().max().item() + 1e-12 * scale,
                                   rtol=1e-6, msg=k)
    eager = run_backward(perturbed(prob, None), prob.inputs(), torch.float32, seed=11)
    new = run_backward(perturbed(prob, module.ModelNew), prob.inputs(), torch.float32, seed=11)
    buffers = [k for k in eager if k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert bool(buffers) == ("track_running_stats=False" not in str(BN_CASES[case][0]))
    for k in buffers:
        torch.testing.assert_close(new[k], eager[k], atol=1e-6, rtol=1e-5, msg=k)
    errs, torch_errs = (_contract_errors(prob, module, f, monkeypatch) for f in (True, False))
    for k, e in errs.items():
        assert e <= 1.01 * torch_errs[k] + 1e-9, (k, e, torch_errs[k])


def test_batchnorm_eval_keeps_the_torch_backward(tmp_path, monkeypatch):
    """Eval mode (running statistics): the fused dZ (batch statistics) is not used; gradients in contract."""
    prob, module, fn = bn_module(tmp_path, "39_tiles")
    calls = _counting_dz(fn, monkeypatch)
    gradient_contract(prob, module, train=False, draws=1)
    assert not calls


def test_batchnorm_without_a_derivative_row_uses_torch(tmp_path):
    """An op without a DERIVATIVES row (tanh-GELU) before the norm: no kernel, the float64 torch backward."""
    prob = load_problem(write_problem(tmp_path, LIN + "\nself.bn = nn.BatchNorm1d(out_features)",
                                      "return self.bn(F.gelu(self.lin(x), approximate='tanh'))", name="gt"))
    compiled, module = compile_to(prob, tmp_path)
    assert [r.kind for r in compiled.regions] == ["gemm_batchnorm"] and not _fns(module)
    gradient_contract(prob, module, train=True, draws=1)


# ---- the backward GEMMs' operands ------------------------------------------------------------------------
@pytest.mark.parametrize("r,c", [(37, 70), (129, 37), (1, 5), (70, 129)])
def test_split_of_a_transposed_view_is_split_x(r, c):
    """dW's operands (dZ^T, X^T) split by two tiled passes over their storage: bit for bit split_x's parts of
    the same values, over rows spanning six orders of magnitude."""
    from kfuse.kernels.backward_ops import split_rows_any
    from kfuse.kernels.gemm_core import split_x
    g = torch.Generator().manual_seed(r * c)
    u = torch.randn(c, r, generator=g) * torch.logspace(-3, 3, r)[None, :]
    u[:, 0] = 0.0  # an all-zero row of u^T: the scale is clamped, as split_x clamps it
    for got, want in zip(split_rows_any(u.t()), split_x(u.t().contiguous())):
        assert torch.equal(got, want)


def _wide_range_operands(m: int, k: int, n: int, seed: int) -> tuple:
    """x (m, k) with rows spanning twelve orders of magnitude, a zero row and a zero column, and dZ (m, n)
    with columns spanning six: what dW = dZ^T X's operand splits must survive."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-6, 6, m)[torch.randperm(m, generator=g)][:, None]
    x[min(3, m - 1)] = 0.0
    x[:, min(5, k - 1)] = 0.0
    dz = torch.randn(m, n, generator=g) * torch.logspace(-3, 3, n)[None, :]
    return x, dz


@pytest.mark.parametrize("m,n", [(129, 37), (70, 129), (1, 5), (200, 64)])
def test_block_split_of_dz_t_reconstructs_it(m, n):
    """split_dzt_blocks: per (row of dZ^T, 64-long stretch of its columns) hi + lo times the stretch's inverse
    scale gives dZ^T / x's row scales to 2^-22 of the stretch's largest value; zeros past M."""
    from kfuse.kernels.backward_ops import split_dzt_blocks
    from kfuse.kernels.gemm_core import split_x
    x, dz = _wide_range_operands(m, 33, n, m * n)
    _, _, s = split_x(x)
    hi, lo, inv = split_dzt_blocks(dz, s)
    assert hi.shape == lo.shape == (n, m) and hi.dtype == torch.float16 and inv.shape == (n, -(-m // 64))
    want = (dz / s[:, None]).t().double()  # exact: s are powers of two
    got = (hi.double() + lo.double()) * inv.double().repeat_interleave(64, dim=1)[:, :m]
    stretch_max = torch.nn.functional.pad(want.abs(), (0, -m % 64)).reshape(n, -1, 64).amax(2)
    bound = 2.0 ** -22 * stretch_max.repeat_interleave(64, dim=1)[:, :m]
    assert ((got - want).abs() <= bound).all()
    pad = hi.untyped_storage().nbytes() // (2 * n * 2) - m  # the (n, 2 MP) parts: zeros in m..MP of each half
    if pad:
        parts = torch.empty(0, dtype=torch.float16).set_(hi.untyped_storage()).reshape(n, -1)
        assert not parts[:, m:m + pad].any() and not parts[:, -pad:].any()


@pytest.mark.parametrize("m,k,n", [(129, 70, 37), (37, 129, 70), (1, 33, 17), (200, 64, 70)])
@pytest.mark.parametrize("kn", [False, True])
def test_dw_from_the_forward_split_of_x(m, k, n, kn):
    """dW = dZ^T X from x's forward split (gemm_dw_presplit, fp16x3p in the interpreter's numpy fp16 dots;
    kn: X^T dZ for an `x @ W` weight, stored transposed by the kernel) against float64: within 2x eager fp32's
    error + 1e-7 relative to the largest |dZ^T| |X| sum (rule 3's shape), and allclose to eager, with rows of x
    1e12 apart, a zero row and a zero column."""
    from kfuse.kernels.backward import gemm_dw_presplit
    from kfuse.kernels.gemm_core import split_x
    x, dz = _wide_range_operands(m, k, n, m + k + n)
    got = gemm_dw_presplit(dz, split_x(x), kn)
    exact = dz.t().double() @ x.double()
    eager = dz.t() @ x
    if kn:  # (k, n), written by the kernel in that layout
        assert got.shape == (k, n) and got.is_contiguous()
        got = got.t()
    size = (dz.t().double().abs() @ x.double().abs()).max().item()
    err, ref = (got.double() - exact).abs().max().item(), (eager.double() - exact).abs().max().item()
    assert got.shape == (n, k) and got.dtype == torch.float32
    assert err <= 2 * ref + 1e-7 * size, (err, ref, size)
    torch.testing.assert_close(got, eager, atol=1e-4 * size, rtol=1e-4)


def test_frozen_weight_keeps_no_x_split(tmp_path, monkeypatch):
    """The forward keeps x's split only while the GEMM's weight needs a gradient (with a frozen W, backward runs no
    dW and the split would only hold memory). The CPU path keeps no split: one is faked in its place."""
    prob = region_problem(tmp_path, "epilogue_mul_leaky")
    _, module = compile_to(prob, tmp_path)
    fn = next(v for v in _fns(module))
    monkeypatch.setattr(module, "saved_for_backward", lambda z, *a: (z, z[:, :1], z[:, :1], z[:, 0]))
    model = prob.build(cls=module.ModelNew)
    x = prob.inputs()[0]
    with torch.no_grad():
        assert len(fn.launch_saving(model, x)[1]) == 4
        model.lin.weight.requires_grad_(False)
        assert len(fn.launch_saving(model, x)[1]) == 1


def test_training_forward_keeps_x_split_only_for_presplit_fp16x3p():
    """runtime.saved_for_backward keeps x's split with z exactly where the GEMM ran fp16x3p on a pre-split x."""
    from kfuse.kernels.gemm_core import GemmConfig
    from kfuse.kernels.runtime import saved_for_backward
    z, ops = torch.zeros(2, 2), tuple(torch.full((1,), float(i)) for i in range(6))
    pre = GemmConfig(128, 128, 64, 8, 8, 3, split_a=False)
    assert saved_for_backward(z, ops, "fp16x3p", pre) == (z, *ops[:3])
    assert saved_for_backward(z, ops, "fp16x3p", GemmConfig(128, 128, 64, 8, 8, 3)) == (z,)  # split in the GEMM
    for scheme in ("ieee", "fp64", "tf32x3", "fp16x3"):
        assert saved_for_backward(z, ops, scheme, pre) == (z,)


# ---- GPU: compiled kernels (TRITON_INTERPRET=0 pytest -m gpu tests/test_training_fast.py) ----------------
def _on_gpu() -> bool:
    import os
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


gpu = pytest.mark.skipif(not _on_gpu(), reason="needs a CUDA GPU and TRITON_INTERPRET=0")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m,k,n", [(1024, 2048, 1536), (300, 257, 129)])
def test_gpu_backward_gemms_within_twice_cublas_error(m, k, n):
    """dX = dZ W and dW = dZ^T X by gemm_nt (fp16x3p, tuned config, transposed splits) vs float64: max error
    at most 2x cuBLAS fp32's own + 1e-7 (rule 3), and allclose to cuBLAS (rule 2)."""
    from kfuse.kernels.backward import gemm_nt
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(m + k + n)
    x = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g) / k ** 0.5
    dz = torch.randn(m, n, device="cuda", generator=g)
    for got, eager, exact in (
            (gemm_nt(dz, w.t(), cache=(w, "dx")), dz @ w, dz.double() @ w.double()),
            (gemm_nt(dz.t(), x.t()), dz.t() @ x, dz.t().double() @ x.double())):
        err, ref = (got.double() - exact).abs().max().item(), (eager.double() - exact).abs().max().item()
        assert err <= 2 * ref + 1e-7, (err, ref)
        torch.testing.assert_close(got, eager, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m,k,n", [(16384, 512, 384), (300, 257, 129)])
def test_gpu_dw_from_the_forward_split_of_x(m, k, n):
    """gemm_dw_presplit on the GPU (tuned config, block-scaled dZ^T, x's row split) vs float64: rule 3 against
    cuBLAS fp32 and allclose to it, for randn operands and for rows of x 1e12 apart; the transposed store of
    `x @ W`'s dW gives the transpose."""
    from kfuse.kernels.backward import gemm_dw_presplit
    from kfuse.kernels.gemm_core import split_x
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(m + k + n)
    wide = [t.cuda() for t in _wide_range_operands(m, k, n, m + k)]
    for x, dz in ((torch.randn(m, k, device="cuda", generator=g), torch.randn(m, n, device="cuda", generator=g)),
                  wide):
        got, eager, exact = gemm_dw_presplit(dz, split_x(x)), dz.t() @ x, dz.t().double() @ x.double()
        err, ref = (got.double() - exact).abs().max().item(), (eager.double() - exact).abs().max().item()
        assert err <= 2 * ref + 1e-7, (err, ref)
        size = (dz.t().double().abs() @ x.double().abs()).max().item()
        torch.testing.assert_close(got, eager, atol=1e-4 * size, rtol=1e-4)
        assert torch.equal(gemm_dw_presplit(dz, split_x(x), kn=True), got.t())


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", ["36_matmul_kn_param_tanh_scale", "22_gemm_add_relu"])
def test_gpu_dw_from_forward_split_in_a_model(tmp_path, monkeypatch, name):
    """An `x @ W` (K, N) region (36) and an nn.Linear one (22) at 512 x 1024 -> 1024 on the GPU: backward's dW
    comes from the forward's split of x (gemm_dw_presplit, transposed store for 36), and every gradient, output
    and buffer meets rules 2 and 3 (train mode). Untuned (the default, pre-split config): at this launch-bound
    size the tuner picks the in-register split of x (SPLIT_A=2), which keeps no split for backward."""
    from kfuse_testing import ROOT
    monkeypatch.setenv("KFUSE_AUTOTUNE", "0")
    from kfuse.gradients import gradient_contract as contract
    from kfuse.optimize import Options, compile_problem, load_module
    prob = load_problem(ROOT / "problems" / "gemm" / f"{name}.py",
                        {"batch_size": 512, "in_features": 1024, "out_features": 1024})
    path = tmp_path / f"{name}_gpu.py"
    path.write_text(compile_problem(prob, Options(device="cuda", trials=1)).source)
    module = load_module(path)
    calls, orig = [], module.gemm_dw_presplit
    monkeypatch.setattr(module, "gemm_dw_presplit", lambda *a: calls.append(a[2:]) or orig(*a))
    verdict = contract(prob, module.ModelNew, device="cuda", draws=2)
    assert verdict.correct, "; ".join(verdict.failures)
    assert calls and all(c == (name.startswith("36"),) for c in calls)


@pytest.mark.gpu
@gpu
def test_gpu_split_of_a_transposed_view_is_split_x():
    from kfuse.kernels.backward_ops import split_rows_any
    from kfuse.kernels.gemm_core import split_x
    u = torch.randn(1030, 777, device="cuda") * torch.logspace(-3, 3, 777, device="cuda")[None, :]
    for got, want in zip(split_rows_any(u.t()), split_x(u.t().contiguous())):
        assert torch.equal(got, want)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", sorted(SMALL))
def test_gpu_seed_gradients_meet_contract(tmp_path, name):
    """The seeds at 512 x 1024 -> 1024 on the GPU: z kept, fused dZ (seed 12), tuned backward GEMMs; every
    gradient, output and buffer within rules 2 and 3 (train mode)."""
    from kfuse.gradients import gradient_contract as contract
    from kfuse.optimize import Options, compile_problem, load_module
    sizes = {k: (512 if "batch" in k else 1024) if k != "num_groups" else 64 for k in SMALL[name]}
    prob = load_problem(SEEDS / f"{name}.py", sizes)
    path = tmp_path / f"{name}_gpu.py"
    path.write_text(compile_problem(prob, Options(device="cuda", trials=1)).source)
    verdict = contract(prob, load_module(path).ModelNew, device="cuda", draws=2)
    assert not [f for f in verdict.failures if "rule 2" not in f], "; ".join(verdict.failures)
    # Rule 2 (allclose against eager) is allowed to fail only where eager fp32 itself is further from float64
    # than kfuse by 2x or more: then kfuse is "not close" to eager because eager is off. Seen on the H100 at this
    # size: seed 39's gemm.weight.grad, kfuse 4.9e-5 from float64, eager 3.1e-4, max diff 2.9e-4 (the contract
    # still reports it failing; at full size, `kfuse bench --train`, all three seeds pass).
    for failure in verdict.failures:
        name = failure.split(":")[0]
        assert 2 * verdict.errors[name] <= verdict.ref_errors[name], failure
