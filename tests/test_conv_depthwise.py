"""kernels/conv_depthwise.py under the Triton CPU interpreter at odd sizes, through the accuracy contract's rules 2 and
3 against torch's conv{1,2,3}d in float64, and a depthwise Conv2d + hardswish compiled by kfuse into a conv_epilogue
region. A GPU test (compiled kernel, full-size KernelBench level 1 problem 82's shape) is skipped without CUDA."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from kfuse.kernels import conv_depthwise as dw  # noqa: E402
from kfuse.kernels.conv import ConvConfig  # noqa: E402

# (input shape, weight shape, stride, padding, dilation, groups). The interpreter's default tile holds a channel's
# pixels whole (its cost is per tl op: conv.py's INTERPRETER_ELEMENTS); STRADDLE splits them into 7 pixel blocks
STRADDLE = ConvConfig(512, 1, 16, 4, 1)
CASES = {
    "2d_3x3": ((3, 7, 37, 29), (7, 1, 3, 3), 1, 1, 1, 7),
    "2d_5x5_stride2": ((3, 7, 37, 29), (7, 1, 5, 5), 2, 2, 1, 7),
    "2d_dilated_tuples": ((3, 7, 37, 29), (7, 1, 3, 5), (1, 2), (2, 0), (2, 1), 7),
    "2d_same_even_multiplier2": ((2, 5, 19, 23), (10, 1, 4, 4), 1, "same", 1, 5),
    "1d_same_dilated_even": ((3, 6, 41), (6, 1, 4), 1, "same", 3, 6),
    "1d_strided_multiplier3": ((2, 4, 33), (12, 1, 5), 3, 1, 1, 4),
    "3d": ((2, 3, 5, 7, 9), (3, 1, 3, 3, 3), (1, 2, 1), 1, 1, 3),
    "3d_valid_multiplier2": ((1, 3, 6, 5, 7), (6, 1, 2, 3, 2), 1, "valid", (2, 1, 1), 3),
}


def _inputs(xs, ws, seed: int, bias: bool):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*xs, generator=g)
    fan_in = int(torch.tensor(ws[1:]).prod())
    w = (torch.rand(*ws, generator=g) * 2 - 1) / fan_in ** 0.5
    b = (torch.rand(ws[0], generator=g) * 2 - 1) / fan_in ** 0.5 if bias else None
    return x, w, b


def _contract(out: torch.Tensor, eager: torch.Tensor, ref: torch.Tensor) -> None:
    """Rules 1-3 of DESIGN.md's accuracy contract against eager fp32 and the float64 evaluation."""
    assert out.shape == ref.shape and out.dtype == eager.dtype
    assert torch.isfinite(out).all(), "unwritten or non-finite outputs"
    assert torch.allclose(out, eager, atol=1e-4, rtol=1e-4)
    err = (out.double() - ref).abs().max().item()
    e_err = (eager.double() - ref).abs().max().item()
    assert err <= 2 * e_err + 1e-7, (err, e_err)


def _check(case: str, seed: int, bias: bool, scheme: str | None = None, cfg: ConvConfig | None = None) -> None:
    xs, ws, *geo = CASES[case]
    x, w, b = _inputs(xs, ws, seed, bias)
    ref = dw.depthwise_ref(x.double(), w.double(), None if b is None else b.double(), *geo)
    out = dw.depthwise_forward(x, w, b, *geo, scheme=scheme, cfg=cfg)
    _contract(out, dw.depthwise_ref(x, w, b, *geo), ref)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_depthwise_meets_the_contract(case):
    """The plan's defaults ("fp64", the interpreter's tile), with bias and without."""
    _check(case, 0, True)
    _check(case, 1, False)


@pytest.mark.parametrize("case", ["2d_3x3", "1d_same_dilated_even", "3d"])
def test_fp32_scheme_meets_the_contract(case):
    """"ieee" (fp32 products and sums in tap order) also holds rules 2 and 3 at these sizes."""
    _check(case, 2, True, scheme="ieee")


@pytest.mark.parametrize("case", ["2d_5x5_stride2", "2d_same_even_multiplier2"])
def test_pixel_blocks_straddled(case):
    """Several pixel blocks a channel, the last one partial; a multiplier of 2 in a 2-wide column tile."""
    xs, ws, *_ = CASES[case]
    _check(case, 3, True, cfg=ConvConfig(STRADDLE.block_m, ws[0] // xs[1], 16, 4, 1))


def test_plan_refuses_a_grouped_conv():
    with pytest.raises(ValueError, match="depthwise"):
        dw.depthwise_plan(torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3), 1, 0, 1, 2)


def test_compiled_region_meets_the_contract(tmp_path):
    """kfuse compiles the conv, its hardswish and the per-channel scale into one conv_epilogue kernel on the
    depthwise tile, verified by the contract on five draws and at an extra shape."""
    from kfuse.load import load_problem
    from kfuse.optimize import Options, optimize
    from kfuse_testing import long_lines

    path = tmp_path / "dw.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.conv = nn.Conv2d(7, 14, 3, stride=2, padding=1, groups=7, bias=False)\n"
        "        self.scale = nn.Parameter(torch.randn(14, 1, 1))\n\n"
        "    def forward(self, x):\n"
        "        return torch.nn.functional.hardswish(self.conv(x)) * self.scale\n\n\n"
        "batch_size = 3\n\n\n"
        "def get_inputs():\n    return [torch.randn(batch_size, 7, 37, 29)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    result = optimize(load_problem(path), Options(device="cpu", trials=2), workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    assert [(r.kind, r.ops()) for r in result.compiled.regions] == [("conv_epilogue", ["conv", "hardswish", "mul"])]
    assert "depthwise_tile" in result.compiled.source and not long_lines(result.compiled.source)


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="compiled kernel: needs CUDA and TRITON_INTERPRET=0 (this file defaults to the interpreter)")
def test_gpu_full_size_82():
    """KernelBench level 1 problem 82's shape (16 x 64 x 512 x 512, 3x3) compiled on the GPU, rules 2 and 3."""
    x, w, b = (t.cuda() if t is not None else None for t in _inputs((16, 64, 512, 512), (64, 1, 3, 3), 0, False))
    torch.backends.cudnn.allow_tf32 = False
    ref = dw.depthwise_ref(x.double(), w.double(), None, 1, 0, 1, 64)
    _contract(dw.depthwise_forward(x, w, None, 1, 0, 1, 64), dw.depthwise_ref(x, w, None, 1, 0, 1, 64), ref)
