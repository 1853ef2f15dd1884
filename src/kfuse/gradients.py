"""The gradient contract (docs/training.md): a ModelNew's gradients against eager fp32 and a float64 evaluation.

Per tensor (each input's and each parameter's gradient for a random upstream gradient, plus the outputs and the
buffers after the call):
  rule 2: torch.allclose(grad, eager_fp32_grad, atol=1e-4, rtol=1e-4), checked where eager itself lies within
          that band of float64 (a gradient that is pure rounding noise, e.g. through the mean over the features
          of a GroupNorm, has no fp32 reference: rule 3 decides there);
  rule 3: max|grad - grad_f64| <= 2 * max|eager_grad - grad_f64| + 1e-7.
Used by `kfuse bench --train` and by tests/test_training.py.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from kfuse.load import Problem

ATOL = RTOL = 1e-4


@dataclass
class GradVerdict:
    """Every tensor's errors; `failures` names each tensor and rule that failed, with the numbers."""

    errors: dict[str, float] = field(default_factory=dict)  # max |kfuse - float64| per tensor
    ref_errors: dict[str, float] = field(default_factory=dict)  # max |eager - float64| per tensor
    failures: list[str] = field(default_factory=list)

    @property
    def correct(self) -> bool:
        return not self.failures

    @property
    def max_abs_err(self) -> float:
        return max(self.errors.values(), default=0.0)

    @property
    def ref_max_abs_err(self) -> float:
        return max(self.ref_errors.values(), default=0.0)

    @property
    def rules(self) -> dict[str, bool]:
        return {"grad_allclose": not any("rule 2" in f for f in self.failures),
                "grad_float64_bound": not any("rule 3" in f for f in self.failures),
                "grad_present": not any("no gradient" in f or "shape" in f for f in self.failures)}

    def merge(self, other: "GradVerdict") -> "GradVerdict":
        worst = {k: max(v, self.errors.get(k, 0.0)) for k, v in other.errors.items()}
        ref = {k: max(v, self.ref_errors.get(k, 0.0)) for k, v in other.ref_errors.items()}
        return GradVerdict({**self.errors, **worst}, {**self.ref_errors, **ref}, self.failures + other.failures)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def run_backward(model: torch.nn.Module, inputs: list[torch.Tensor], dtype: torch.dtype, seed: int) -> dict:
    """Outputs, every input's and parameter's gradient, and the buffers after one forward + backward."""
    xs = [t.to(dtype).clone().requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    torch.manual_seed(seed)  # Dropout draws the same masks in every model
    out = model(*xs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    gen = torch.Generator().manual_seed(seed + 7)
    ups = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device, dtype) for o in outs]
    torch.autograd.backward(outs, ups)
    res = {f"out{i}": o.detach() for i, o in enumerate(outs)}
    res |= {f"input{i}.grad": x.grad for i, x in enumerate(xs) if x.grad is not None}
    res |= {f"{k}.grad": p.grad for k, p in model.named_parameters()}
    res |= {k: b for k, b in model.named_buffers()}
    return res


def compare_runs(eager: dict, new: dict, f64: dict) -> GradVerdict:
    """Rules 2 and 3 for every gradient, output and buffer of one run (see the module docstring)."""
    v = GradVerdict()
    for k in sorted(eager.keys() | new.keys()):
        e, n = eager.get(k), new.get(k)
        if e is None or n is None:
            v.failures.append(f"{k}: no gradient ({'kfuse' if n is None else 'eager'})")
            continue
        if n.shape != e.shape or n.dtype != e.dtype:
            v.failures.append(f"{k}: shape/dtype {tuple(n.shape)} {n.dtype}, expected {tuple(e.shape)} {e.dtype}")
            continue
        if not n.is_floating_point():
            if not torch.equal(n, e):
                v.failures.append(f"{k}: rule 2, integer buffer differs")
            continue
        d = f64[k]
        if torch.allclose(e.double(), d.double(), atol=ATOL, rtol=RTOL) and not torch.allclose(
                n, e, atol=ATOL, rtol=RTOL):
            v.failures.append(f"{k}: rule 2, max diff {max_err(n, e):.3g}")
        v.errors[k], v.ref_errors[k] = max_err(n, d), max_err(e, d)
        bound = 2 * v.ref_errors[k] + 1e-7
        if not v.errors[k] <= bound:  # NaN fails too
            v.failures.append(f"{k}: rule 3, {v.errors[k]:.3g} > {bound:.3g}")
    return v


def gradient_contract(problem: Problem, cls: type, *, device: str = "cpu", draws: int = 2,
                      train: bool = True) -> GradVerdict:
    """`draws` fresh models and inputs: eager fp32, `cls` (a ModelNew) with the same state, and a float64 copy
    of the eager model, each run forward + backward for the same upstream gradient; worst errors over draws."""
    verdict = GradVerdict()
    for d in range(draws):
        torch.manual_seed(d)
        ref = problem.build(device=device)
        new = problem.build(cls=cls, device=device)
        new.load_state_dict(ref.state_dict(), strict=True)
        f64 = copy.deepcopy(ref).double()
        for m in (ref, new, f64):
            m.train(train)
        torch.manual_seed(1000 + d)
        inputs = problem.inputs(device=device)
        runs = [run_backward(m, inputs, dt, d) for m, dt in
                ((ref, torch.float32), (new, torch.float32), (f64, torch.float64))]
        verdict = verdict.merge(compare_runs(*runs))
    return verdict
