"""Rule 2's reference (eager, or float64 where eager itself is not allclose to float64), `kernelbench_allclose`,
and the float64 evaluation sized to free memory: slices of the batch, refusals, the one-line error."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from kfuse import memory, verify
from kfuse.cli import app
from kfuse.errors import KfuseError
from kfuse.load import load_problem
from kfuse.verify import (
    TOLERANCES,
    Reference,
    Results,
    check_contract,
    combine_references,
    compare,
    reference_run,
    run_in_process,
)
from kfuse_testing import ROOT, requires_cuda, write_problem

TOL = TOLERANCES["fp32"]
KERNELBENCH = ROOT.parent / "shared" / "kernelbench"


def reference(eager: list[torch.Tensor], f64: list[torch.Tensor], kernelbench: list[torch.Tensor] | None = None
              ) -> Reference:
    return Reference(0, [], Results(eager, {}), Results(f64, {}), kernelbench)


def off_in_one_place(t: torch.Tensor, by: float) -> torch.Tensor:
    out = t.clone()
    out.view(-1)[3] += by
    return out


def test_eager_is_the_reference_where_it_is_close_to_float64():
    f = torch.randn(8, 5, dtype=torch.float64)
    e = f.float()
    ok = compare(Results([e.clone()], {}), reference([e], [f]), TOL)
    assert ok.ok and ok.allclose_reference == "eager" and ok.kernelbench_allclose
    bad = compare(Results([off_in_one_place(e, 1e-3)], {}), reference([e], [f]), TOL)
    assert not bad.rules["allclose"] and "not allclose to eager" in bad.failures[0]


def test_float64_is_the_reference_where_eager_is_not():
    f = torch.randn(8, 5, dtype=torch.float64)
    e = off_in_one_place(f.float(), 1e-3)  # eager's own rounding beyond the tolerance, in one element
    exact = compare(Results([f.float()], {}), reference([e], [f]), TOL)
    assert exact.ok and exact.allclose_reference == "float64", exact.failures
    assert not exact.kernelbench_allclose  # KernelBench compares with eager: the exact answer fails there
    like_eager = compare(Results([e.clone()], {}), reference([e], [f]), TOL)
    assert not like_eager.rules["allclose"] and "not allclose to float64" in like_eager.failures[0]


def test_reference_per_output_and_mixed():
    f1, f2 = torch.randn(4, 3, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    e1, e2 = f1.float(), off_in_one_place(f2.float(), 1e-2)
    v = compare(Results([e1.clone(), f2.float()], {}), reference([e1, e2], [f1, f2]), TOL)
    assert v.ok and v.allclose_reference == "mixed"
    assert combine_references(["eager", "eager"]) == "eager"
    assert combine_references(["float64", ""]) == "float64"
    assert combine_references(["eager", "float64"]) == "mixed"
    assert combine_references([]) == "eager"


def test_kernelbench_allclose_compares_with_default_flag_eager():
    f = torch.randn(8, 5, dtype=torch.float64)
    e = f.float()
    tf32_like = e + 3e-3  # eager under cuDNN TF32: what KernelBench compares with
    v = compare(Results([e.clone()], {}), reference([e], [f], [tf32_like]), TOL)
    assert v.ok and not v.kernelbench_allclose
    v = compare(Results([tf32_like.clone()], {}), reference([e], [f], [tf32_like]), TOL)
    assert not v.ok and v.kernelbench_allclose  # informative only: the verdict is the contract's


def test_reference_is_float64_for_a_model_that_rounds_away_its_input(tmp_path):
    """(x + 1e8) - 1e8 in fp32 keeps multiples of 8: eager is far from float64, which returns x. An exact
    candidate passes against float64; eager itself, as a candidate, fails rule 2."""
    path = write_problem(tmp_path, "self.big = 1e8", "return (x + self.big) - self.big",
                         batch=16, k=24, n=24)
    prob = load_problem(path)
    base = prob.model_cls

    class Exact(base):
        def forward(self, x):
            return ((x.double() + self.big) - self.big).float()

    rep = check_contract(prob, run_in_process(Exact), device="cpu", trials=2)
    assert rep.correct and rep.allclose_reference == "float64" and not rep.kernelbench_allclose, rep.failures
    rep = check_contract(prob, run_in_process(base), device="cpu", trials=1)
    assert not rep.correct and rep.rules["allclose"] is False and rep.rules["float64_bound"] is True


def test_report_keys(tmp_path):
    path = write_problem(tmp_path, "self.gemm = nn.Linear(in_features, out_features)",
                         "return torch.relu(self.gemm(x))", batch=5, k=16, n=8)
    report = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["optimize", str(path), "--device", "cpu", "-o", str(tmp_path / "new.py"),
                                   "--json", str(report), "--trials", "1"])
    assert res.exit_code == 0, res.output
    rep = json.loads(report.read_text())
    assert rep["allclose_reference"] == "eager" and rep["kernelbench_allclose"] is True


# --- the float64 evaluation sized to free memory (made-up free bytes on the CPU) ----------------------------


def fake_free(monkeypatch: pytest.MonkeyPatch, nbytes: int) -> None:
    monkeypatch.setattr(memory, "device_free", lambda device: nbytes)


def spy(monkeypatch: pytest.MonkeyPatch, name: str) -> list:
    calls, real = [], getattr(verify, name)

    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(result)
        return result

    monkeypatch.setattr(verify, name, wrapped)
    return calls


LINEAR = ("self.gemm = nn.Linear(in_features, out_features)", "return torch.tanh(self.gemm(x))")
# eager: 2112 B of parameters, 8192 B of inputs, 4096 B of outputs; float64 twice that
SIZES = {"batch": 64, "k": 32, "n": 16}


def test_float64_in_slices_where_the_whole_batch_does_not_fit(tmp_path, monkeypatch):
    prob = load_problem(write_problem(tmp_path, *LINEAR, **SIZES))
    whole, _ = reference_run(prob, 3, "cpu")
    fake_free(monkeypatch, 20_000)  # eager fits (14 kB), float64 (29 kB) does not
    ref, _ = reference_run(prob, 3, "cpu")
    assert whole.float64_run == "whole" and ref.float64_run == "2 slices"
    assert torch.allclose(ref.f64.outputs[0], whole.f64.outputs[0], rtol=1e-12, atol=1e-15)
    assert torch.equal(ref.eager.outputs[0], whole.eager.outputs[0])


def test_no_slices_where_the_forward_mixes_rows(tmp_path, monkeypatch):
    """x - x.mean(0) shows in no module: the check of the last slice against eager's rows refuses it."""
    prob = load_problem(write_problem(tmp_path, LINEAR[0], "y = self.gemm(x)\nreturn y - y.mean(0)", **SIZES))
    whole, _ = reference_run(prob, 3, "cpu")
    fake_free(monkeypatch, 20_000)
    agrees = spy(monkeypatch, "_last_slice_agrees")
    ref, _ = reference_run(prob, 3, "cpu")
    assert agrees == [False] and ref.float64_run == "cpu"
    assert torch.allclose(ref.f64.outputs[0], whole.f64.outputs[0], rtol=1e-12, atol=1e-15)


def test_no_slices_with_batch_statistics(tmp_path, monkeypatch):
    prob = load_problem(write_problem(tmp_path, LINEAR[0] + "\nself.bn = nn.BatchNorm1d(out_features)",
                                      "return self.bn(self.gemm(x))", **SIZES))
    whole, _ = reference_run(prob, 3, "cpu")
    fake_free(monkeypatch, 20_000)
    agrees = spy(monkeypatch, "_last_slice_agrees")
    ref, _ = reference_run(prob, 3, "cpu")
    assert agrees == [] and ref.float64_run == "cpu"  # refused from the module tree, before any check
    assert torch.allclose(ref.f64.outputs[0], whole.f64.outputs[0], rtol=1e-12, atol=1e-15)
    assert torch.allclose(ref.f64.buffers["bn.running_mean"], whole.f64.buffers["bn.running_mean"], rtol=1e-12)


def test_eager_model_that_does_not_fit_is_one_line(tmp_path, monkeypatch):
    prob = load_problem(write_problem(tmp_path, *LINEAR, **SIZES))
    fake_free(monkeypatch, 10_000)
    with pytest.raises(KfuseError) as err:
        reference_run(prob, 0, "cpu")
    assert str(err.value) == f"{prob.path}: the eager model needs ~0.0 GB, the GPU has 0.0 GB free"
    assert err.value.exit_code == 2


# --- on a GPU, at KernelBench's full sizes ----------------------------------------------------------------


def kernelbench(level: int, name: str, **overrides: int):
    path = KERNELBENCH / f"level{level}" / name
    if not path.exists():
        pytest.skip(f"{path} not here")
    return load_problem(path, overrides)


@requires_cuda
@pytest.mark.gpu
def test_full_size_relu_is_verified_without_running_out_of_memory():
    """level1/19_ReLU: 6.4 GB in, 6.4 GB out, 12.9 GB each in float64 (it ran an 80 GB GPU out of memory)."""
    prob = kernelbench(1, "19_ReLU.py")
    rep = check_contract(prob, run_in_process(prob.model_cls), device="cuda", trials=2)
    assert rep.correct and rep.allclose_reference == "eager" and rep.kernelbench_allclose, rep.failures


@requires_cuda
@pytest.mark.gpu
def test_full_size_l1norm_float64_in_slices_matches_whole(monkeypatch):
    """level1/38_L1Norm at a quarter of its batch, the free memory made to look small enough that the float64
    evaluation is sliced: it equals the whole one."""
    prob = kernelbench(1, "38_L1Norm_.py", batch_size=1024)
    whole, _ = reference_run(prob, 1, "cuda")
    expected = whole.f64.outputs[0].cpu()
    del whole
    real_free = memory.device_free
    need = 1024 * 65535 * 4 * 4  # fp32 in + out
    monkeypatch.setattr(memory, "device_free", lambda device: min(real_free(device), int(1.5 * need)))
    ref, _ = reference_run(prob, 1, "cuda")
    assert ref.float64_run.endswith("slices")
    assert torch.allclose(ref.f64.outputs[0].cpu(), expected, rtol=1e-12, atol=0)


@requires_cuda
@pytest.mark.gpu
def test_eager_model_too_big_for_the_gpu_is_one_line():
    prob = kernelbench(1, "19_ReLU.py", batch_size=40960)  # 64 GB in, 64 GB out
    with pytest.raises(KfuseError, match=r"the eager model needs ~129\.\d GB, the GPU has [\d.]+ GB free"):
        reference_run(prob, 0, "cuda")
