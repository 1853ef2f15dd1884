"""problems/gemm/: the GEMM-anchored family in KernelBench format, each optimized at small odd sizes in the
interpreter and checked with the accuracy contract; the files themselves keep the format and full sizes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kfuse.load import load_problem
from kfuse.optimize import Options, optimize
from kfuse_testing import ROOT, long_lines

GEMM = ROOT / "problems" / "gemm"
PROBLEMS = sorted(GEMM.glob("*.py"))
CPU = Options(device="cpu", trials=2)

# Regions each problem must get (the rest of the file's ops may stay torch calls, and are then listed).
KINDS = {
    "04_gemm_divide_sum_scaling": ["gemm_rowsum"],
    "05_matmul_sum_max_avg_logsumexp": ["gemm_rowsum"],
    "06_matmul_scale_residual_clamp_logsumexp_mish": ["gemm_rowreduce"],
    "08_gemm_groupnorm_hardtanh": ["gemm_groupnorm_wide"],
    "09_matmul_swish_biasadd_groupnorm": ["gemm_groupnorm"],
    "11_gemm_batchnorm_groupnorm_gelu_mean_relu": ["gemm_batchnorm"],
    "14_matmul_maxpool_sum_scale": ["gemm_pool"],
    "15_matmul_sigmoid_sum": ["gemm_rowreduce"],
    "23_gemm_max_subtract_gelu": ["gemm_rowreduce"],
    "28_gemm_biasadd_hardtanh_mish_groupnorm": ["gemm_groupnorm_wide"],
    "31_matmul_avgpool_gelu_scale_max": ["gemm_pool"],
    "32_matmul_gelu_softmax": ["gemm_rowreduce"],
    "33_gemm_layernorm_relu_odd": ["gemm_rowreduce"],
    "34_gemm_instancenorm_residual": ["gemm_rowreduce"],
    "35_mlp_linear_relu_linear": ["gemm_epilogue", "gemm_epilogue"],
    "38_gemm_batchnorm_eval_relu": ["gemm_batchnorm"],
    "40_gemm_mean_gelu_odd": ["gemm_rowreduce"],
    "42_gemm_layernorm_sigmoid_gate": ["gemm_rowreduce"],
    "43_gemm_groupnorm_narrow_tanh": ["gemm_groupnorm_wide"],
}


def small(path: Path) -> dict[str, int]:
    """Batch 9 (1 where the problem is about a batch of 1), K = 20, N = 72 (two column tiles, not a multiple
    of 16). Where N is grouped: 18 groups of 4 (one-kernel GroupNorm) for 09, 11, 27; 2 groups of 36 for 08
    and 4 groups of 18 for 28 (two-phase GroupNorm: groups straddle the column tiles); 8 groups of 9 for the
    others (43: two-phase, a tile touching up to (BLOCK_N - 1) // 9 + 2 groups)."""
    src = path.read_text()
    out = {"batch_size": 1 if "batch1" in path.stem else 9, "in_features": 20, "out_features": 72}
    if "num_groups" in src:
        wide = {"08": 2, "28": 4}
        out["num_groups"] = 18 if path.stem.startswith(("09_", "11_", "27_")) else wide.get(path.stem[:2], 8)
    if "pool_kernel_size" in src:
        out["pool_kernel_size"] = 4
    return out


def test_enough_problems_in_kernelbench_format():
    assert len(PROBLEMS) >= 30
    for path in PROBLEMS:
        tree = ast.parse(path.read_text())
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        consts = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        assert {"Model", "get_inputs", "get_init_inputs"} <= names, path.name
        assert "batch_size" in consts, path.name


def test_family_sizes_are_covered():
    sizes = set()
    for path in PROBLEMS:
        c = load_problem(path).constants()
        sizes.add((c["batch_size"], c["in_features"], c["out_features"]))
    assert {(1024, 8192, 8192), (128, 32768, 32768), (16384, 4096, 4096), (2048, 8192, 8192)} <= sizes
    assert any(n % 16 for _, _, n in sizes) and any(b == 1 for b, _, _ in sizes)


@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: p.stem)
def test_problem_small(tmp_path, path):
    result = optimize(load_problem(path, small(path)), CPU, workdir=tmp_path)
    assert result.contract.correct, result.contract.failures
    kinds = [r.kind for r in result.compiled.regions if r.kind != "torch"]
    assert not long_lines(result.compiled.source)
    assert kinds, "the GEMM is always fused"
    if path.stem in KINDS:
        assert kinds == KINDS[path.stem]
    listed = [n.origin for r in result.compiled.regions if r.kind == "torch" for n in r.nodes]
    assert result.compiled.unfused == listed
