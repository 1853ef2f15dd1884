"""The ModelNew file: standalone, same constructor, same parameters, state_dict round trip."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest
import torch

from kfuse.load import load_problem
from kfuse.optimize import Options, load_module, optimize
from kfuse_testing import SEEDS, SMALL

ALLOWED_IMPORTS = {"torch", "triton", "dataclasses", "os", "math", "json", "hashlib", "pathlib", "time",
                   "typing", "__future__", "functools", "itertools", "collections", "warnings", "weakref"}


@pytest.fixture(scope="module", params=sorted(SMALL))
def generated(request, tmp_path_factory):
    prob = load_problem(SEEDS / f"{request.param}.py", SMALL[request.param])
    result = optimize(prob, Options(device="cpu", trials=1), workdir=tmp_path_factory.mktemp(request.param))
    assert result.contract.correct, result.contract.failures
    return prob, result.candidate_path


def test_imports_only_torch_triton_stdlib(generated):
    _, path = generated
    tree = ast.parse(path.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= ALLOWED_IMPORTS, names - ALLOWED_IMPORTS


def test_keeps_original_problem_verbatim(generated):
    prob, path = generated
    text = path.read_text()
    assert prob.source.strip() in text
    assert "class ModelNew(Model)" in text


def test_same_seed_same_parameters_and_state_dict_round_trip(generated):
    prob, path = generated
    module = load_module(path)
    torch.manual_seed(3)
    ref = prob.build()
    torch.manual_seed(3)
    new = prob.build(cls=module.ModelNew)
    for (k1, v1), (k2, v2) in zip(ref.state_dict().items(), new.state_dict().items(), strict=True):
        assert k1 == k2 and v1.shape == v2.shape and torch.equal(v1, v2)
    other = prob.build(cls=module.ModelNew)
    other.load_state_dict(ref.state_dict(), strict=True)
    x = prob.inputs()
    with torch.no_grad():
        torch.testing.assert_close(other(*x), ref(*x), atol=1e-4, rtol=1e-4)


def test_runs_standalone_without_kfuse(generated, tmp_path):
    """The file runs in a fresh interpreter in which `import kfuse` fails, at another constructor size."""
    prob, path = generated
    script = f"""
import sys, importlib.util
sys.modules['kfuse'] = None  # any import of kfuse now raises
spec = importlib.util.spec_from_file_location('m', {str(path)!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
import torch
for name, value in {dict(prob.overrides)!r}.items():
    setattr(m, name, value)
m.batch_size = 5
if hasattr(m, 'scale_shape'):  # derived at module level from out_features
    m.scale_shape = (m.out_features,)
torch.manual_seed(0); ref = m.Model(*m.get_init_inputs())
torch.manual_seed(0); new = m.ModelNew(*m.get_init_inputs())
x = m.get_inputs()
with torch.no_grad():
    torch.testing.assert_close(new(*x), ref(*x), atol=1e-4, rtol=1e-4)
print('ok')
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_constructor_arguments_read_at_run_time(tmp_path):
    """A ModelNew built with another multiplier and slope than the captured one still matches Model."""
    prob = load_problem(SEEDS / "12_gemm_multiply_leakyrelu.py", SMALL["12_gemm_multiply_leakyrelu"])
    result = optimize(prob, Options(device="cpu", trials=1), workdir=tmp_path)
    module = load_module(result.candidate_path)
    args = [70, 129, -3.5, 0.3]
    torch.manual_seed(1)
    ref = module.Model(*args)
    torch.manual_seed(1)
    new = module.ModelNew(*args)
    x = torch.randn(9, 70)
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
