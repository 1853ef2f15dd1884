"""Accuracy of the eval-mode BatchNorm fold (`bn-eval-fold`) against the epilogue path it replaces.

For each model and each way of setting the running statistics, both ModelNew variants (folded W' and b', and
the one-kernel epilogue with the running statistics that kfuse emits when the fold is off) and eager fp32 are
compared with the model run in float64 over several draws; the ratio column is rule 3's: error / eager's error
(the contract allows 2 x eager + 1e-7). Runs the kernels in Triton's interpreter without a GPU; `--scheme
fp16x3p` runs the GPU's split scheme's arithmetic there (fp16 hi/lo parts of W', as tests/test_weight_cache.py
does), `--in-features` changes K.

    PYTHONPATH=src:tests TRITON_INTERPRET=1 python benchmarks/batchnorm/fold_accuracy.py [--draws 8] [--scheme fp16x3p]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module
from kfuse.regions import gemm_batchnorm
from kfuse_testing import write_problem

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"batch_size": 37, "in_features": 70, "out_features": 129}
LIN = "self.lin = nn.Linear(in_features, out_features)"
SYNTHETIC = {  # name: (init, forward)
    "linear_scale_bn": (LIN + "\nself.s = nn.Parameter(torch.randn(out_features))"
                              "\nself.bn = nn.BatchNorm1d(out_features)",
                        "return torch.relu(self.bn(self.lin(x) * self.s))"),
    "kn_matmul_bn_no_affine": ("self.w = nn.Parameter(torch.randn(in_features, out_features) / 8)\n"
                               "self.bn = nn.BatchNorm1d(out_features, affine=False)",
                               "return torch.tanh(self.bn(x @ self.w))"),
    "linear_no_bias_bn_gelu": ("self.lin = nn.Linear(in_features, out_features, bias=False)"
                               "\nself.bn = nn.BatchNorm1d(out_features)",
                               "return F.gelu(self.bn(self.lin(x)))"),
}
FILES = {"38_gemm_batchnorm_eval_relu": "problems/gemm/38_gemm_batchnorm_eval_relu.py",
         "39_gemm_scale_batchnorm": "problems/seeds/39_gemm_scale_batchnorm.py",
         "30_matmul_batchnorm_biasadd_divide_swish": "problems/gemm/30_matmul_batchnorm_biasadd_divide_swish.py"}


def set_statistics(model: torch.nn.Module, how: str, prob, seed: int) -> None:
    """Running statistics (and affine) as a trained model has them ('trained': 5 training batches), random
    ones ('random'), or with tiny variances that make s = gamma / sqrt(var + eps) large ('small_var')."""
    g = torch.Generator().manual_seed(seed)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    with torch.no_grad():
        if how == "trained":
            model.train()
            for _ in range(5):
                model(*prob.inputs())
        for bn in bns:
            n = bn.num_features
            if how == "random":
                bn.running_mean.copy_(torch.randn(n, generator=g) * 3)
                bn.running_var.copy_(torch.rand(n, generator=g) * 4 + 0.05)
            elif how == "small_var":
                bn.running_mean.copy_(torch.randn(n, generator=g))
                bn.running_var.copy_(torch.rand(n, generator=g) * 1e-3)
            if how != "trained" and bn.affine:
                bn.weight.copy_(torch.randn(n, generator=g))
                bn.bias.copy_(torch.randn(n, generator=g))
    model.eval()


def max_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).abs().max())


def generated(prob, fold: bool, workdir: Path, tag: str, scheme: str):
    with mock.patch.object(gemm_batchnorm, "fold_plan", gemm_batchnorm.fold_plan if fold else (lambda r: None)):
        source = compile_problem(prob, Options(device="cpu")).source
    path = workdir / f"{tag}_{'fold' if fold else 'epilogue'}.py"
    path.write_text(source)
    module = load_module(path)
    if scheme != "ieee":
        module.GEMM_SCHEME = scheme
        module.gemm_scheme = lambda x: scheme
    return module


def measure(prob, how: str, draws: int, workdir: Path, tag: str, scheme: str) -> dict[str, float]:
    mods = {k: generated(prob, k == "fold", workdir, tag, scheme) for k in ("fold", "epilogue")}
    torch.manual_seed(0)
    ref = prob.build()
    set_statistics(ref, how, prob, 1)
    f64 = copy.deepcopy(ref).double()
    news = {}
    for k, m in mods.items():
        news[k] = prob.build(cls=m.ModelNew)
        news[k].load_state_dict(ref.state_dict())
        news[k].eval()
    errs = {"eager": 0.0, "fold": 0.0, "epilogue": 0.0}
    with torch.no_grad():
        for d in range(draws):
            torch.manual_seed(100 + d)
            x = prob.inputs()[0]
            want = f64(x.double())
            errs["eager"] = max(errs["eager"], max_err(ref(x), want))
            for k, new in news.items():
                errs[k] = max(errs[k], max_err(new(x), want))
    return errs


def problems(workdir: Path):
    for name, rel in FILES.items():
        yield name, load_problem(ROOT / rel, SMALL)
    for name, (init, fwd) in SYNTHETIC.items():
        yield name, load_problem(write_problem(workdir, init, fwd, name=name, k=SMALL["in_features"]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--scheme", default="ieee", choices=["ieee", "fp16x3p"])
    ap.add_argument("--in-features", type=int, default=70)
    args = ap.parse_args()
    SMALL["in_features"] = args.in_features
    print(f"torch {torch.__version__}, 37 x {args.in_features} -> 129, GEMM scheme {args.scheme}, {args.draws} draws, "
          "max abs error vs float64")
    print("| model | statistics | eager fp32 | fold (ratio) | epilogue (ratio) | fold within 2x + 1e-7 |")
    print("| --- | --- | --- | --- | --- | --- |")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, prob in problems(work):
            for how in ("trained", "random", "small_var"):
                e = measure(prob, how, args.draws, work, f"{name}_{how}", args.scheme)
                within = e["fold"] <= 2 * e["eager"] + 1e-7
                ok &= within
                print(f"| {name} | {how} | {e['eager']:.2e} | {e['fold']:.2e} ({e['fold'] / e['eager']:.2f}) | "
                      f"{e['epilogue']:.2e} ({e['epilogue'] / e['eager']:.2f}) | {'yes' if within else 'NO'} |",
                      flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
