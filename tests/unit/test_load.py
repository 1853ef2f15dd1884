"""The loader, device-free: every bad input is a ProblemError that names the file (on the command line: one line,
exit code 2, no traceback; tests/test_cli_errors.py)."""

from __future__ import annotations

import json

import pytest

from kfuse.errors import ProblemError
from kfuse.load import load_problem, parse_set
from kfuse_testing import SEEDS, write_problem

GOOD = SEEDS / "12_gemm_multiply_leakyrelu.py"


def test_overrides_reach_derived_constants(tmp_path):
    path = tmp_path / "p.py"
    path.write_text(GOOD.read_text().replace("out_features = 8192", "out_features = in_features * 2"))
    prob = load_problem(path, {"in_features": 10, "batch_size": 3})
    assert prob.constants()["out_features"] == 20
    assert prob.inputs()[0].shape == (3, 10)
    assert prob.batch_constant() == "batch_size"


def test_parse_set_numbers():
    assert parse_set(["a=3", "b=0.5", "c=1e-3"]) == {"a": 3, "b": 0.5, "c": 1e-3}


BAD_FILES = {
    "syntax": ("def broken(:\n", "syntax error at line 1"),
    "no_model": ("import torch\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n", "Model missing"),
    "no_get_inputs": ("import torch.nn as nn\nclass Model(nn.Module): pass\ndef get_init_inputs(): return []\n",
                      "get_inputs missing"),
    "raises_at_import": ("raise RuntimeError('boom')\n", "running the file raised RuntimeError: boom"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_are_problem_errors(tmp_path, case):
    text, message = BAD_FILES[case]
    path = tmp_path / f"{case}.py"
    path.write_text(text)
    with pytest.raises(ProblemError, match=message):
        load_problem(path)


def test_missing_and_not_python(tmp_path):
    with pytest.raises(ProblemError, match="file not found"):
        load_problem(tmp_path / "nope.py")
    other = tmp_path / "model.txt"
    other.write_text("x = 1\n")
    with pytest.raises(ProblemError, match="not a Python file"):
        load_problem(other)


def test_constructor_raising(tmp_path):
    path = write_problem(tmp_path, "raise ValueError('bad size')", "return x")
    with pytest.raises(ProblemError, match=r"Model\(\*get_init_inputs\(\)\) raised ValueError: bad size"):
        load_problem(path).build()


def test_get_inputs_non_tensor(tmp_path):
    """Numbers may stand beside tensors (`A * s`, KernelBench level 1 problem 5); anything else, or no tensor, is
    bad."""
    path = write_problem(tmp_path, "self.l = nn.Linear(in_features, out_features)", "return self.l(x)",
                         inputs="3, 'a'")
    with pytest.raises(ProblemError, match="get_inputs\\(\\) must return tensors \\(and numbers\\), got str"):
        load_problem(path).inputs()
    only_numbers = write_problem(tmp_path, "self.l = nn.Linear(in_features, out_features)", "return self.l(x)",
                                 inputs="3, 2.5", name="numbers")
    with pytest.raises(ProblemError, match="got no tensor"):
        load_problem(only_numbers).inputs()
    mixed = write_problem(tmp_path, "self.l = nn.Linear(in_features, out_features)", "return self.l(x)",
                          inputs="torch.rand(batch_size, in_features), 2.5", name="mixed")
    assert load_problem(mixed).inputs()[1] == 2.5


def test_unknown_and_non_numeric_set():
    with pytest.raises(ProblemError, match="--set nope: no module-level constant"):
        load_problem(GOOD, {"nope": 1})
    with pytest.raises(ProblemError, match="value is not a number"):
        parse_set(["batch_size=many"])


TUPLES = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, layer_sizes, kernel_size):
        super().__init__()
        self.kernel_size = kernel_size
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip([width, *layer_sizes], layer_sizes))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


height, width = 128, 128
a = b = 3
(c, [d, e]) = 1, (2, 3)
layer_sizes = [64, 32]
kernel_size = (3, 5)
area = height * width


def get_inputs():
    return [torch.rand(height, width)]


def get_init_inputs():
    return [layer_sizes, kernel_size]
'''


def test_set_reaches_tuple_and_chained_assignments(tmp_path):
    path = tmp_path / "tuples.py"
    path.write_text(TUPLES)
    prob = load_problem(path, {"height": 4, "width": 6, "a": 5, "e": 9})
    consts = prob.constants()
    assert (consts["height"], consts["width"], consts["area"]) == (4, 6, 24)  # derived constants follow
    assert (consts["a"], consts["b"], consts["c"], consts["d"], consts["e"]) == (5, 3, 1, 2, 9)
    assert prob.inputs()[0].shape == (4, 6)


def test_set_takes_lists_and_tuples(tmp_path):
    path = tmp_path / "tuples.py"
    path.write_text(TUPLES)
    overrides = parse_set(["layer_sizes=[48, 40]", "kernel_size=(3,7)", "width=10"])
    assert overrides == {"layer_sizes": [48, 40], "kernel_size": (3, 7), "width": 10}
    prob = load_problem(path, overrides)
    model = prob.build()
    assert [layer.out_features for layer in model.layers] == [48, 40] and model.kernel_size == (3, 7)
    assert model(*prob.inputs()).shape == (128, 40)
    assert json.loads(json.dumps(prob.overrides)) == {"layer_sizes": [48, 40], "kernel_size": [3, 7], "width": 10}


def test_parse_set_values():
    assert parse_set(["a=[[1, 2], (3, 4.5)]", "b=-2", "c=inf"]) == {"a": [[1, 2], (3, 4.5)], "b": -2, "c": float("inf")}
    for bad in ("a=True", "a=[]", "a='s'", "a=1+2", "a=[1, 'x']", "a=f(3)"):
        with pytest.raises(ProblemError, match="value is not a number or a list of numbers"):
            parse_set([bad])


def test_set_on_a_constant_that_is_not_numeric(tmp_path):
    path = tmp_path / "tuples.py"
    path.write_text(TUPLES + "name = 'conv'\n")
    with pytest.raises(ProblemError, match="--set name: name is not a numeric constant"):
        load_problem(path, {"name": 3})
