"""A fixed sample of KernelBench's own files (../shared/kernelbench, levels 1-3) through `kfuse optimize` on the CPU
at the sizes kfuse picks: one command, every row exit 0, verified, and no traceback anywhere.

The sample mixes what kfuse fuses (products of inputs, batched, matvec, GEMM epilogues, GEMVs, row reductions,
MLPs, convolutions, transposed ones too) with what it keeps as torch calls (pooling, scans) and
forwards it cannot trace (attention with sizes read from tensors): the whole range of what a user brings. The full
sweep of all 250 files is `scripts/sweep-kernelbench` (benchmarks/kernelbench/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kfuse_testing import ROOT

KERNELBENCH = ROOT.parent / "shared" / "kernelbench"
SAMPLE = [
    "level1/1_Square_matrix_multiplication_.py", "level1/2_Standard_matrix_multiplication_.py",
    "level1/3_Batched_matrix_multiplication.py", "level1/4_Matrix_vector_multiplication_.py",
    "level1/5_Matrix_scalar_multiplication.py", "level1/11_4D_tensor_matrix_multiplication.py",
    "level1/12_Matmul_with_diagonal_matrices_.py", "level1/14_Matmul_for_upper_triangular_matrices.py",
    "level1/18_Matmul_with_transposed_both.py", "level1/25_Swish.py", "level1/43_Max_Pooling_3D.py",
    "level1/90_cumprod.py", "level1/100_HingeLoss.py",
    "level2/12_Gemm_Multiply_LeakyReLU.py", "level2/14_Gemm_Divide_Sum_Scaling.py", "level2/76_Gemm_Add_ReLU.py",
    "level2/18_Matmul_Sum_Max_AvgPool_LogSumExp_LogSumExp.py", "level2/29_Matmul_Mish_Mish.py",
    "level2/66_Matmul_Dropout_Softmax.py", "level2/22_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish.py",
    "level2/21_Conv2d_Add_Scale_Sigmoid_GroupNorm.py", "level2/31_Conv2d_Min_Add_Multiply.py",
    "level2/71_Conv2d_Divide_LeakyReLU.py", "level2/74_ConvTranspose3d_LeakyReLU_Multiply_LeakyReLU_Max.py",
    "level3/1_MLP.py", "level3/3_DeepNarrowMLP.py", "level3/4_LeNet5.py", "level3/8_ResNetBasicBlock.py",
    "level3/43_MinGPTCausalAttention.py", "level3/50_ReLUSelfAttention.py",
]


@pytest.mark.slow
@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="../shared/kernelbench is not beside this checkout")
def test_kernelbench_sample_all_verified(tmp_path):
    assert len(SAMPLE) >= 30
    rows_path = tmp_path / "rows.json"
    run = subprocess.run([sys.executable, "-m", "kfuse", "optimize", *[str(KERNELBENCH / f) for f in SAMPLE],
                          "--device", "cpu", "-o", str(tmp_path / "out"), "--json", str(rows_path)],
                         capture_output=True, text=True, timeout=1800, env={**os.environ, "COLUMNS": "200"})
    assert "Traceback" not in run.stdout + run.stderr
    rows = json.loads(rows_path.read_text())
    bad = [(Path(r.get("path", "?")).name, r.get("exit"), r.get("error") or r.get("failures", [])[:2]) for r in rows
           if r.get("exit") != 0 or not r.get("correct")]
    assert not bad, bad
    assert len(rows) == len(SAMPLE) and run.returncode == 0
    fused = [r for r in rows if any(x["fused"] for x in r["regions"])]
    assert len(fused) >= 15  # products, epilogues and MLPs on kfuse's kernels, not all torch calls
