"""autosize: on the CPU, a problem sized for a GPU becomes a small instance that builds and runs in eager PyTorch,
its structural constants untouched; `kfuse optimize` uses it unless --set or --full-size says otherwise."""

from __future__ import annotations

import json
import time

import torch
from typer.testing import CliRunner

from kfuse.autosize import (
    Budget,
    Cost,
    _time_left,
    choose_sizes,
    conv_structure,
    describe,
    halve,
    meta_cost,
    size_constants,
)
from kfuse.cli import app
from kfuse.load import load_problem

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"

MLP = HEADER + '''
class Model(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        sizes = [input_size, *layer_sizes]
        self.layers = nn.Sequential(*[m for a, b in zip(sizes, sizes[1:]) for m in (nn.Linear(a, b), nn.ReLU())])
        self.out = nn.Linear(sizes[-1], output_size)

    def forward(self, x):
        return self.out(self.layers(x))


batch_size = 1024
input_size = 8192
layer_sizes = [8192, 4096]
output_size = 1000
hidden = 2 * input_size  # derived: follows input_size, never halved itself


def get_inputs():
    return [torch.rand(batch_size, input_size)]


def get_init_inputs():
    return [input_size, layer_sizes, output_size]
'''

CONV = HEADER + '''
class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, groups=groups)

    def forward(self, x):
        return torch.relu(self.conv(x))


batch_size = 128
in_channels, out_channels = 3, 96
height, width = 1024, 512
kernel_size = 3
stride = 2
groups = 3


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, groups]
'''

# A grouped transposed convolution (KernelBench level 1 problem 72's shape): 32 channels in 4 groups. Halved to 4
# channels it would be depthwise, another problem for kfuse (conv_structure).
GROUPED = HEADER + '''
class Model(nn.Module):
    def __init__(self, in_channels, out_channels, groups):
        super().__init__()
        self.conv = nn.ConvTranspose3d(in_channels, out_channels, (3, 5, 7), stride=(2, 2, 2), groups=groups)

    def forward(self, x):
        return self.conv(x)


batch_size = 8
in_channels = 32
out_channels = 32
depth, height, width = 12, 24, 48
groups = 4


def get_inputs():
    return [torch.rand(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, groups]
'''

# LayerNorm over 2 * length features: `features` and `length` only shrink together (halved at once).
COUPLED = HEADER + '''
class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        return self.norm(x.flatten(1))


batch_size = 4096
length = 8192
features = 16384


def get_inputs():
    return [torch.rand(batch_size, 2, length)]


def get_init_inputs():
    return [features]
'''

# A classifier sized for 32 x 32 images (LeNet): the image cannot shrink, the batch can.
FIXED_IMAGE = HEADER + '''
class Model(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 5)
        self.fc = nn.Linear(16 * 14 * 14, num_classes)

    def forward(self, x):
        return self.fc(F.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1))


batch_size = 16384
image_size = 32
num_classes = 10


def get_inputs():
    return [torch.rand(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return [num_classes]
'''

# A constructor that reads a value (`.item()`) cannot run on meta: searched with real runs.
READS_VALUES = HEADER + '''
class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = float(torch.ones(1).sum().item())

    def forward(self, x):
        return self.linear(x) * self.scale


batch_size = 4096
in_features = 1024
out_features = 1024


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
'''

# Just over budget (512 x 512 in and out): quick at full size too.
RELU = '''
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


batch_size = 512
dim = 512


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
'''


def write(tmp_path, text, name="problem"):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return load_problem(path)


def small(problem, on_meta: bool = True):
    """The chosen instance: found in seconds, it builds and runs; it fits the budget on meta where it runs there."""
    start = time.perf_counter()
    chosen = choose_sizes(problem)
    assert time.perf_counter() - start < 10.0  # seconds, not minutes (4.4 s once on a 2-core machine under load)
    prob = problem.with_overrides(chosen)
    with torch.no_grad():
        prob.build()(*prob.inputs())
    assert not on_meta or meta_cost(prob, Budget()).fits(Budget()), describe(chosen)
    return chosen, prob.constants()


def test_size_constants_and_halve(tmp_path):
    prob = write(tmp_path, CONV)
    assert size_constants(prob) == {"batch_size": 128, "out_channels": 96, "height": 1024, "width": 512}
    mlp = write(tmp_path, MLP, "mlp")
    assert size_constants(mlp) == {"batch_size": 1024, "input_size": 8192, "layer_sizes": [8192, 4096],
                                   "output_size": 1000}  # `hidden` is derived
    assert halve("layer_sizes", [8192, 4096], 2) == [2048, 1024] and halve("shape", (3, 240, 7)) == (3, 120, 7)
    assert halve("height", 8) == 4 and halve("height", 7) is None  # sizes stop at 4
    assert halve("batch_size", 3) == 1 and halve("batch_size", 1) is None  # a batch goes down to 1


def test_lists_of_layer_sizes(tmp_path):
    chosen, consts = small(write(tmp_path, MLP))
    assert isinstance(chosen["layer_sizes"], list) and max(chosen["layer_sizes"]) < 8192
    assert consts["hidden"] == 2 * consts["input_size"]


def test_structural_constants_are_kept(tmp_path):
    chosen, consts = small(write(tmp_path, CONV))
    assert (consts["kernel_size"], consts["stride"], consts["groups"], consts["in_channels"]) == (3, 2, 3, 3)
    assert consts["height"] < 1024 and consts["width"] < 512 and "kernel_size" not in chosen


def test_grouped_convolutions_stay_grouped(tmp_path):
    """Halving stops short of one channel a group: 32 in 4 groups goes to 8, not to a depthwise 4 in 4."""
    chosen, consts = small(write(tmp_path, GROUPED))
    assert consts["in_channels"] // consts["groups"] >= 2 and consts["out_channels"] < 32, describe(chosen)
    assert conv_structure(write(tmp_path, GROUPED, "full").build(device="meta")) == (False,)


def test_coupled_sizes_shrink_together(tmp_path):
    chosen, consts = small(write(tmp_path, COUPLED))
    assert consts["features"] == 2 * consts["length"] < 16384


def test_a_size_the_model_fixes_is_kept(tmp_path):
    chosen, consts = small(write(tmp_path, FIXED_IMAGE))
    assert consts["image_size"] == 32 and consts["batch_size"] < 16384


def test_a_model_that_cannot_run_on_meta(tmp_path):
    chosen, consts = small(write(tmp_path, READS_VALUES), on_meta=False)
    assert consts["batch_size"] * consts["in_features"] < 4096 * 1024


def test_a_slow_real_candidate_keeps_the_search_going():
    """Past search_seconds the search goes on only while it holds a candidate measured for real whose forward, run
    verify_runs times by the verification, would take longer than the search has so far; never past
    real_search_seconds (level 3 problem 30 stopped at a batch of 5, 3.8 s a forward, after 6 s of search)."""
    b = Budget(search_seconds=6.0, verify_runs=18, real_search_seconds=60.0)
    assert _time_left(5.9, Cost(complete=False), b)  # within search_seconds: always
    assert not _time_left(6.1, Cost(complete=False), b)  # nothing measured for real: stop
    assert not _time_left(6.1, Cost(elements=10**9, flops=10**12), b)  # a meta cost: stop
    assert _time_left(20.0, Cost(seconds=3.8), b)  # 18 x 3.8 s = 68 s of verification ahead
    assert not _time_left(20.0, Cost(seconds=1.0), b)  # 18 s ahead: not worth 20 s of search
    assert not _time_left(60.5, Cost(seconds=30.0), b)  # the cap


def test_small_problems_stay_as_they_are(tmp_path):
    text = MLP.replace("1024\n", "37\n").replace("8192", "70").replace("[70, 4096]", "[64]").replace("1000", "129")
    assert choose_sizes(write(tmp_path, text)) == {}


def test_a_forward_that_always_raises_is_quick(tmp_path):
    text = MLP.replace("return self.out(self.layers(x))", "raise ValueError('never runs')")
    start = time.perf_counter()
    choose_sizes(write(tmp_path, text))
    assert time.perf_counter() - start < 10.0  # seconds, not minutes (4.4 s once on a 2-core machine under load)


def test_optimize_on_the_cpu_picks_a_small_instance(tmp_path):
    path = tmp_path / "mlp.py"
    path.write_text(MLP)
    report = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["optimize", str(path), "--device", "cpu", "--trials", "1",
                                   "-o", str(tmp_path / "new.py"), "--json", str(report)])
    assert res.exit_code == 0, res.output
    overrides = json.loads(report.read_text())["overrides"]
    assert overrides and overrides["input_size"] < 8192
    line = next(line for line in res.stderr.splitlines() if "small instance" in line)
    assert describe(overrides) in line and "--full-size" in line
    # --set: exactly what was asked, nothing automatic
    res = CliRunner().invoke(app, ["optimize", str(path), "--device", "cpu", "--trials", "1", "--set", "batch_size=8",
                                   "--set", "input_size=16", "--set", "layer_sizes=[24,8]", "--set", "output_size=5",
                                   "-o", str(tmp_path / "new.py"), "--json", str(report)])
    assert res.exit_code == 0, res.output
    assert json.loads(report.read_text())["overrides"] == {"batch_size": 8, "input_size": 16, "layer_sizes": [24, 8],
                                                           "output_size": 5}
    assert "small instance" not in res.stderr


def test_full_size_keeps_the_files_sizes(tmp_path):
    path = tmp_path / "relu.py"
    path.write_text(HEADER + RELU)
    assert choose_sizes(load_problem(path))  # over budget: autosize would shrink it
    report = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["optimize", str(path), "--device", "cpu", "--trials", "1", "--full-size",
                                   "-o", str(tmp_path / "new.py"), "--json", str(report)])
    assert res.exit_code == 0, res.output
    assert json.loads(report.read_text())["overrides"] == {} and "small instance" not in res.stderr
