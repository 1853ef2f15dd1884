"""Property: for a random chain (a Linear, then 1 to 5 ops of the family), `kfuse optimize`'s ModelNew meets the
accuracy contract against eager on the CPU, whatever kfuse fuses and whatever it leaves as torch calls.

Chains are built from tables by the shape of the current value: full width (M, N), pooled (M, N / k), per
row with the dim kept (M, 1), per row flattened (M,). Sizes are tiny and odd (N = 72 spans two column tiles of the
interpreter's 64), and hypothesis is derandomized so CI sees the same chains every run."""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kfuse.load import load_problem
from kfuse.optimize import Options, optimize

CPU = Options(device="cpu", trials=2)

# pointwise ops: (name, extra __init__ line with {i}, expression of {y}; {z} is the GEMM output)
POINTWISE = [
    ("relu", "", "torch.relu({y})"), ("gelu", "", "F.gelu({y})"), ("gelu_tanh", "", "F.gelu({y}, approximate='tanh')"),
    ("tanh", "", "torch.tanh({y})"), ("sigmoid", "", "torch.sigmoid({y})"), ("silu", "", "F.silu({y})"),
    ("mish", "", "F.mish({y})"), ("leaky_relu", "self.act{i} = nn.LeakyReLU(0.2)", "self.act{i}({y})"),
    ("hardswish", "", "F.hardswish({y})"), ("hardtanh", "", "F.hardtanh({y}, -0.5, 0.5)"),
    ("clamp", "", "torch.clamp({y}, min=-1.0, max=2.0)"), ("softplus", "", "F.softplus({y})"),
    ("scale", "self.m{i} = 1.7", "{y} * self.m{i}"), ("shift", "", "{y} - 0.3"), ("scale_chain", "", "{y} * 2.0 / 4.0"),
    ("double", "", "{y} + {y}"), ("swish", "", "{y} * torch.sigmoid({y})"),
    ("resid", "", "2 * torch.sigmoid({y}) + {y}"),
]
FULL_ONLY = [
    ("vector", "self.s{i} = nn.Parameter(torch.randn(out_features))", "{y} * self.s{i}"),
    ("saved", "", "{y} * 0.5 + {z}"),
]
NORMS = [  # full width -> full width, statistics over rows or groups
    ("softmax", "", "torch.softmax({y}, dim=1)"), ("log_softmax", "", "F.log_softmax({y}, dim=-1)"),
    ("layernorm", "self.ln{i} = nn.LayerNorm(out_features)", "self.ln{i}({y})"),
    ("groupnorm", "self.gn{i} = nn.GroupNorm(4, out_features)", "self.gn{i}({y})"),
    ("batchnorm", "self.bn{i} = nn.BatchNorm1d(out_features)", "self.bn{i}({y})"),
]
POOLS = [  # full width -> pooled width (N // k): non-overlapping 1-d pooling over the features
    ("maxpool", "self.mp{i} = nn.MaxPool1d(2)", "self.mp{i}({y}.unsqueeze(1)).squeeze(1)"),
    ("avgpool", "", "F.avg_pool1d({y}.unsqueeze(1), 4).squeeze(1)"),
]
REDUCTIONS = [  # full width -> per row; {k}: keepdim
    ("sum", "torch.sum({y}, dim=1, keepdim={k})"), ("mean", "{y}.mean(dim=-1, keepdim={k})"),
    ("amax", "torch.amax({y}, dim=1, keepdim={k})"), ("max", "torch.max({y}, dim=1, keepdim={k})[0]"),
    ("min", "torch.min({y}, 1, keepdim={k}).values"), ("logsumexp", "torch.logsumexp({y}, dim=1, keepdim={k})"),
]
SIZE_ONE = [  # (M, 1) -> (M, 1): reductions over the kept dim are identities (rewrite reduce-size-1)
    ("sum1", "", "torch.sum({y}, dim=1, keepdim=True)"), ("lse1", "", "torch.logsumexp({y}, dim=1, keepdim=True)"),
    ("softmax1", "", "torch.softmax({y}, dim=1)"),
]

TEMPLATE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.lin = nn.Linear(in_features, out_features)
{init}

    def forward(self, x):
        z = self.lin(x)
        y = z
{body}
        return y


batch_size = {batch}
in_features = {k}
out_features = {n}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
'''


@st.composite
def chains(draw):
    """(source, names): a problem file whose forward is a Linear then 1 to 5 ops, and the op names."""
    state, normed = "full", False  # normed: a sum/mean right after a norm is a constant plus rounding noise
    init, body, names = [], [], []
    for i in range(draw(st.integers(1, 5))):
        if state == "full":
            kind = draw(st.sampled_from(["pointwise", "pointwise", "norm", "reduce", "pool"]))
        elif state == "pooled":
            kind = draw(st.sampled_from(["pointwise", "pointwise", "reduce"]))
        else:
            kind = draw(st.sampled_from(["pointwise", "pointwise"] + (["size_one"] if state == "row_keep" else [])))
        if kind == "reduce":
            allowed = [r for r in REDUCTIONS if not (normed and r[0] in ("sum", "mean"))]
            name, expr = draw(st.sampled_from(allowed))
            keep = draw(st.booleans())
            line, extra = expr.format(y="y", k=keep), ""
            state = "row_keep" if keep else "row_flat"
        else:
            table = {"pointwise": POINTWISE + (FULL_ONLY if state == "full" else []), "norm": NORMS,
                     "size_one": SIZE_ONE, "pool": POOLS}[kind]
            name, extra, expr = draw(st.sampled_from(table))
            line = expr.format(y="y", z="z", i=i)
            normed = normed or kind == "norm"
            state = "pooled" if kind == "pool" else state
        names.append(name)
        if extra:
            init.append(extra.format(i=i))
        body.append(f"y = {line}")
    batch = draw(st.sampled_from([1, 5, 13]))
    if "batchnorm" in names:
        batch = max(batch, 5)  # training-mode BatchNorm needs more than one row
    src = TEMPLATE.format(init=textwrap.indent("\n".join(init) or "pass", " " * 8),
                          body=textwrap.indent("\n".join(body), " " * 8), batch=batch,
                          k=draw(st.sampled_from([7, 20])), n=draw(st.sampled_from([16, 72])))
    return src, names


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(chains())
def test_random_chain_meets_contract(chain):
    src, names = chain
    workdir = Path(tempfile.mkdtemp(prefix="kfuse-prop-"))
    path = workdir / "chain.py"
    path.write_text(src)
    result = optimize(load_problem(path), CPU, workdir=workdir)
    assert result.contract.correct, (names, result.contract.failures, src)
    assert result.compiled.regions[0].kind != "torch", names  # the Linear itself is always fused
