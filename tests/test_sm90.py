"""The Hopper twins of the generated GEMM kernels (regions/sm90_twin.py, kernels/gemm_sm90.py).

Without a GPU: each GEMM kernel comes with a twin that has the same parameters and epilogue and the Gluon tile in
place of gemm_tile; launchers pick it only for sm90 configs; the tuner offers sm90 configs only where sm90_ok
holds; and the seeds' twins compile for sm_90 (Triton's bundled ptxas) without spilling, in the shared memory an
H100 has. On a Hopper GPU (marked gpu): every seed with its GEMMs forced onto the twin meets the accuracy contract
at odd sizes and far from the unit range, and the twin agrees with the Triton tile.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kfuse.kernels import gemm_core as gc
from kfuse.kernels import gemm_sm90, runtime
from kfuse.load import load_problem
from kfuse.optimize import Options, compile_problem, load_module
from kfuse.regions.common import constexpr, plain, signature, sm90_twin
from kfuse.verify import check_contract, run_in_process
from kfuse_testing import SEEDS, SMALL, requires_cuda, write_problem

SM90 = gc.GemmConfig(128, 128, 64, 8, 8, 3, split_a=False, sm90=True, chunk=4)


def _module(tmp_path, name: str, sizes: dict, device: str = "cpu"):
    prob = load_problem(SEEDS / f"{name}.py", sizes)
    path = tmp_path / f"{name}_new.py"
    path.write_text(compile_problem(prob, Options(device=device)).source)
    return prob, path, load_module(path)


def test_twin_source_is_the_kernel_with_the_gluon_tile():
    decls = (*plain("a_ptr", "M", "N", "K"), constexpr("BLOCK_M"), constexpr("K_SLICES"), constexpr("STORE_Z", "False"))
    twin = sm90_twin("lin_relu", decls, "doc")
    params = signature(decls)
    assert "@sm90_jit\ndef lin_relu_kernel_sm90(a_ptr, M, N, K," in twin
    assert "STORE_Z: tl.constexpr = False, STAGES: tl.constexpr = 3, CHUNK: tl.constexpr = 4,\n" in twin
    assert ("def lin_relu_tiles_sm90(st, STAGES: tl.constexpr, CHUNK: tl.constexpr, TAIL: tl.constexpr, tail_split, "
            f"tail_ws, tail_cnt,\n        {params}):") in twin
    # every path runs the kernel's own epilogue function, with the tile's offsets made by Gluon's arange: one tile
    # per block, a persistent block's tiles, a tail tile's last slice
    call = ("lin_relu_epilogue(acc, pid_m, pid_n, pid_m * BLOCK_M + gl.arange(0, BLOCK_M), "
            "pid_n * BLOCK_N + gl.arange(0, BLOCK_N), a_ptr, M, N, K, BLOCK_M, K_SLICES, STORE_Z)")
    flat = " ".join(twin.split())  # long calls are wrapped over lines
    assert flat.count(call) == 3
    assert "EVEN_K, GROUP_M=GROUP_M, STAGES=STAGES, CHUNK=CHUNK)" in twin and "acc = gemm_tile_sm90(" in twin
    assert "acc = sm90_tile_mma(st, i, n_k, BLOCK_M, BLOCK_N, STAGES, CHUNK)" in twin
    assert "(lin_relu_tiles_sm90, (st, STAGES, CHUNK, TAIL, tail_split, tail_ws, tail_cnt, a_ptr, M, N, K," in flat
    assert "sm90_tail_done(acc, slot, j, tail_ws, tail_cnt, tail_split, BLOCK_M, BLOCK_N)" in twin
    assert "tl.arange" not in twin and "@triton.jit" not in twin and "def lin_relu_epilogue" not in twin


def test_kernel_and_twin_share_one_epilogue():
    """The epilogue is written once, a jit function the Triton kernel and its Hopper twin both call."""
    from kfuse.regions.common import KernelArgs, gemm_kernel

    src = gemm_kernel("lin_relu", "doc", ["out0"], KernelArgs(), ["v = tl.maximum(acc, 0.0)"])
    assert src.count("def lin_relu_epilogue(") == 1 and src.count("v = tl.maximum(acc, 0.0)") == 1
    calls = src.count("lin_relu_epilogue(acc, pid_m, pid_n,") - src.count("def lin_relu_epilogue(")
    assert calls == 4  # the kernel, and the twin's three paths
    assert "def lin_relu_kernel(" in src and "def lin_relu_kernel_sm90(" in src


@pytest.mark.parametrize("name", sorted(SMALL))
def test_generated_files_carry_and_pick_the_twins(tmp_path, name):
    _, path, module = _module(tmp_path, name, SMALL[name])
    source = path.read_text()
    for kernel in [k for k in dir(module) if k.endswith("_kernel_sm90")]:
        assert kernel[:-len("_sm90")] in dir(module)  # every twin beside its Triton kernel
        assert f"pick_kernel({kernel[:-len('_sm90')]}, {kernel}, cfg)[grid](" in source
    assert any(k.endswith("_kernel_sm90") for k in dir(module))
    assert module.pick_kernel("k", "k90", SM90) == "k90"
    assert module.pick_kernel("k", "k90", dataclasses.replace(SM90, sm90=False)) == "k"
    assert module.sm90_options(SM90) == {"STAGES": 3, "CHUNK": 4, "PERSISTENT": False, "maxnreg": 168}
    assert module.gemm_grid(300, 520, SM90, torch.device("cpu")) == (15,)  # a block per tile (3 x 5)
    assert module.gemm_grid(300, 520, dataclasses.replace(SM90, persistent=True), torch.device("cpu")) == (4,)
    assert module.sm90_options(dataclasses.replace(SM90, sm90=False)) == {}


def test_sm90_configs_and_candidates():
    big, small = (1024, 8192, 8192), (37, 129, 70)
    assert gc.sm90_configs(*big, "fp16x3p") and all(c.sm90 and not c.split_a for c in gc.sm90_configs(*big, "fp16x3p"))
    assert not gc.sm90_configs(*big, "tf32x3") and not gc.sm90_configs(*small, "fp16x3p")
    with_sm90 = runtime.tune_candidates(*big, "fp16x3p", 16, sm90=True)
    assert [c for c in with_sm90 if c.sm90] == gc.sm90_configs(*big, "fp16x3p")
    assert not any(c.sm90 for c in runtime.tune_candidates(*big, "fp16x3p", 16, sm90=False))
    assert not any(c.sm90 for c in runtime.tune_candidates(*big, "fp16x3p", 256, sm90=True))  # groups of 256 columns
    assert SM90.short().endswith("_sm90c4") and "sm90" not in dataclasses.replace(SM90, sm90=False).short()
    # the consumers' and the producer group's registers fit the SM's 65536 at launch
    assert (SM90.num_warps + 4) * 32 * gc.sm90_maxnreg(SM90.num_warps) <= 65536
    assert not runtime.sm90_ok(torch.zeros(1))  # a CPU tensor never runs the twin


def test_tail_split_plan(monkeypatch):
    """Where a persistent grid's last wave is a few tiles, sm90_options asks the twin to split them along K: 39's
    4096 tiles on an H100's 132 SMs leave 4, cut into 8 slices; 12's 512 leave 116 (no room for two slices each);
    a grid of fewer tiles than SMs, a one-tile config and a call without the shape get no split."""
    monkeypatch.setattr(runtime, "_num_sms", lambda device: 132)
    pers = dataclasses.replace(SM90, persistent=True)
    cpu = torch.device("cpu")
    tail = runtime.sm90_options(pers, 16384, 4096, 4096, cpu)
    assert (tail["TAIL"], tail["tail_split"], tail["PERSISTENT"]) == (True, 8, True)
    assert tail["tail_ws"].numel() == 4 * 8 * 128 * 128 and tail["tail_ws"].dtype == torch.float32
    assert tail["tail_cnt"].tolist() == [0, 0, 0, 0] and tail["tail_cnt"].dtype == torch.int32
    assert runtime.sm90_options(pers, 16384, 4096, 3 * 64, cpu)["tail_split"] == 3  # at most a slice per K block
    monkeypatch.setattr(runtime, "_num_sms", lambda device: 64)
    assert runtime.sm90_options(pers, 2100, 500, 700, cpu)["tail_split"] == 8  # 17 x 4 tiles: 4 left on 64 SMs
    monkeypatch.setattr(runtime, "_num_sms", lambda device: 132)
    for shape in [(1024, 8192, 8192), (300, 520, 700), (128 * 132, 128, 4096)]:  # 116 left; 15 tiles; none left
        assert "TAIL" not in runtime.sm90_options(pers, *shape, cpu), shape
    assert "TAIL" not in runtime.sm90_options(SM90, 16384, 4096, 4096, cpu)
    assert "TAIL" not in runtime.sm90_options(pers)


# (problem, variant) -> most spilled bytes ptxas may report; None: must not compile (GroupNorm's reshape of the
# accumulator's own layout: the persistent twin has no shared memory left for a layout change). Variants: one tile
# per block, persistent, persistent with a tail split (sm90_tail).
# The persistent twins spill a little since the promotion waits for hi*hi only (12: 0 -> 108 B, 39: 40 -> 60 B):
# interleaved on the H100 they still ran 3-4% faster than with a full drain (benchmarks/gemm/NOTES.md, "Early
# promotion wait, tail split, a fair tuner").
TWIN_BUILDS = {(name, "one-tile"): 0 for name in SMALL} | {
    ("12_gemm_multiply_leakyrelu", "persistent"): 128, ("39_gemm_scale_batchnorm", "persistent"): 64,
    ("12_gemm_multiply_leakyrelu", "tail"): 128, ("39_gemm_scale_batchnorm", "tail"): 64,
    ("62_matmul_groupnorm_leakyrelu_sum", "persistent"): None}
VARIANTS = {"one-tile": SM90, "persistent": dataclasses.replace(SM90, persistent=True),
            "tail": dataclasses.replace(SM90, persistent=True)}


@pytest.mark.skipif(not gemm_sm90.HAVE_GLUON, reason="needs Triton with Gluon")
@pytest.mark.parametrize("name, variant", sorted(TWIN_BUILDS))
def test_seed_twins_compile_for_sm90(tmp_path, name, variant):
    from kfuse.sm90_compile import SM90_LIMIT_SMEM, compile_twins, record_launches, twin_specs
    prob, path, module = _module(tmp_path, name, SMALL[name])
    torch.manual_seed(0)
    model = module.ModelNew(*prob.init_inputs())
    inputs = prob.inputs()
    specs = twin_specs(record_launches(module, lambda: model(*inputs)), VARIANTS[variant], tail=variant == "tail")
    assert specs, "no GEMM launch went through pick_kernel"
    spill = TWIN_BUILDS[name, variant]
    if spill is None:
        with pytest.raises(RuntimeError, match="GluonResolveAutoEncodings"):
            compile_twins(str(path), specs)
        return
    for build in compile_twins(str(path), specs):
        assert build.spill_bytes <= spill, build
        assert build.shared <= SM90_LIMIT_SMEM, build


def _on_hopper() -> bool:
    return torch.cuda.is_available() and runtime.sm90_ok(torch.empty(0, device="cuda"))


requires_hopper = pytest.mark.skipif(not _on_hopper(), reason="needs a Hopper GPU (sm_90) and Gluon")

ODD = {  # rows past a tile, K not a multiple of 64, columns past a tile
    "12_gemm_multiply_leakyrelu": {"batch_size": 300, "in_features": 700, "out_features": 520},
    "62_matmul_groupnorm_leakyrelu_sum": {"batch_size": 300, "input_size": 700, "hidden_size": 528,
                                          "num_groups": 33},
    "39_gemm_scale_batchnorm": {"batch_size": 300, "in_features": 700, "out_features": 520},
}


def _forced(module, cfg) -> None:
    """Every GEMM of the generated module runs `cfg`, untuned."""
    module.TUNER.force(cfg)


@requires_cuda
@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("name, persistent", [(name, False) for name in sorted(ODD)] + [
    ("12_gemm_multiply_leakyrelu", True), ("39_gemm_scale_batchnorm", True)])
def test_seeds_on_the_twin_meet_the_contract(tmp_path, name, persistent):
    prob, _, module = _module(tmp_path, name, ODD[name], device="cuda")
    _forced(module, dataclasses.replace(SM90, persistent=persistent))
    report = check_contract(prob, run_in_process(module.ModelNew), device="cuda", trials=3)
    assert report.correct, report.failures


@requires_cuda
@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["39_gemm_scale_batchnorm", "12_gemm_multiply_leakyrelu"])
def test_tail_split_meets_the_contract(tmp_path, name):
    """A persistent grid whose last wave is a few tiles (8 column tiles x (SMs / 8 + 1) row tiles, the last ones
    partial, K = 700): the tail tiles' K slices summed by whichever block finishes last, then the epilogue
    (39: BatchNorm's partial statistics from those tiles too)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = (sms // 8 + 1) * 128 - 37
    prob, _, module = _module(tmp_path, name, {"batch_size": rows, "in_features": 700, "out_features": 1000},
                              device="cuda")
    cfg = dataclasses.replace(SM90, persistent=True)
    assert module.sm90_options(cfg, rows, 1000, 704, torch.device("cuda"))["TAIL"]
    _forced(module, cfg)
    report = check_contract(prob, run_in_process(module.ModelNew), device="cuda", trials=3)
    assert report.correct, report.failures


@requires_cuda
@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("inputs", ["torch.rand(batch_size, in_features) * 1e-6",
                                    "torch.rand(batch_size, in_features) * 1e6",
                                    "torch.randn(batch_size, in_features)"])
def test_twin_far_from_the_unit_range(tmp_path, inputs):
    path = write_problem(tmp_path, "self.gemm = nn.Linear(in_features, out_features)",
                         "return F.leaky_relu(self.gemm(x) * 2.0, 0.1)", inputs=inputs, batch=300, k=1100, n=260)
    prob = load_problem(path)
    out = tmp_path / "range_new.py"
    out.write_text(compile_problem(prob, Options(device="cuda")).source)
    module = load_module(out)
    _forced(module, SM90)
    report = check_contract(prob, run_in_process(module.ModelNew), device="cuda", trials=2)
    # rule 3 must hold at every range; rule 2's absolute atol cannot at 1e6 (tests/test_range.py says why)
    assert report.rules["float64_bound"] and report.rules["shape_dtype"], report.failures


@requires_cuda
@requires_hopper
@pytest.mark.gpu
def test_twin_agrees_with_the_triton_tile(tmp_path, monkeypatch):
    prob, _, module = _module(tmp_path, "12_gemm_multiply_leakyrelu", ODD["12_gemm_multiply_leakyrelu"], "cuda")
    monkeypatch.setattr(module, "SETTINGS", dataclasses.replace(module.SETTINGS, cuda_graphs=False))
    torch.manual_seed(0)
    model = module.ModelNew(*prob.init_inputs()).cuda()
    x = torch.rand(300, 700, device="cuda")
    outs = {}
    for cfg in (SM90, dataclasses.replace(SM90, sm90=False)):
        _forced(module, cfg)
        with torch.no_grad():
            outs[cfg.sm90] = model(x)
    ref = torch.nn.functional.leaky_relu((x.double() @ model.gemm.weight.double().t() + model.gemm.bias.double())
                                         * 2.0, 0.1)
    for out in outs.values():
        assert (out.double() - ref).abs().max() < 1e-5
    assert (outs[True] - outs[False]).abs().max() < 1e-5
