"""Long-K GEMMs (K >= gemm_core.LONG_K) on the split schemes: K slices of fp32 partials, summed in float64.

The interpreter emulates the fp16 products, so the slicing, the padded-K tail and the partials' layout are checked
here at odd sizes against a float64 product; the speed and the contract at full size are the GPU's (bench).
"""

import pytest
import torch

from kfuse.kernels import runtime as rt
from kfuse.kernels.gemm_core import LONG_K, GemmConfig, default_config, long_k_configs, sm90_configs, valid_configs


@pytest.mark.parametrize("slices", [1, 3, 7])
def test_partials_sum_to_the_product(slices):
    torch.manual_seed(0)
    M, N, K = 37, 70, 1000  # K not a multiple of 64: the zero-padded tail lands in the last slice
    x, w = torch.randn(M, K), torch.randn(N, K)
    cfg = GemmConfig(64, 128, 64, 8, 4, 3, split_a=False, k_slices=slices)
    ops, k_run, (s_row, s_slice, s_col, _) = rt.product_operands(x, w, False, "fp16x3p", cfg)
    part = ops[0]
    assert k_run == K and part.dtype == torch.float32 and part.stride() == (s_slice, s_row, s_col)
    ref = x.double() @ w.double().T
    fp32_err = ((x @ w.T).double() - ref).abs().max()
    assert (part.double().sum(0) - ref).abs().max() <= 2 * fp32_err + 1e-6


def test_kn_layout_and_cached_weight_give_the_same_partials():
    torch.manual_seed(1)
    x, w = torch.randn(5, 300), torch.randn(300, 9)  # x @ W with W (K, N)
    cfg = GemmConfig(64, 128, 64, 8, 4, 3, split_a=False, k_slices=2)
    a = rt.gemm_operands(x, w, True, "fp16x3p", cfg)[0][0]
    b = rt.product_operands(x, w, True, "fp16x3p", cfg)[0][0]
    assert torch.equal(a, b)


def test_long_k_is_always_split_and_never_the_hopper_twin():
    M, N, K = 256, 256, 524288
    assert all(c.k_slices > 1 for c in valid_configs(M, N, K, "fp16x3p"))
    assert default_config(M, N, K, "fp16x3p").k_slices > 1
    assert sm90_configs(M, N, K, "fp16x3p") == []
    assert long_k_configs(M, N, LONG_K - 1) == [] and not default_config(M, N, 8192, "fp16x3p").k_slices


def test_tile_scheme_reads_partials_for_split_configs():
    assert rt.tile_scheme("fp16x3p", GemmConfig(64, 128, 64, 8, 4, 3, split_a=False, k_slices=4)) == "fp64"
    assert rt.tile_scheme("fp16x3p", GemmConfig(64, 128, 64, 8, 4, 3, split_a=False)) == "fp16x3p"


@pytest.mark.parametrize("rows, cols", [(5, 20000), (3, 40001)])
def test_long_rows_split_in_chunks_give_the_same_bits(rows, cols, monkeypatch):
    """Rows past LONG_ROW are split by (row, chunk) programs: the same parts and scales as one program a row."""
    from kfuse.kernels import gemm_core

    torch.manual_seed(2)
    x = torch.randn(rows, cols) * torch.logspace(-3, 3, rows)[:, None]
    x[0, 7] = 1e6
    chunked = (*gemm_core.split_x(x), gemm_core.row_scales(x))
    monkeypatch.setattr(gemm_core, "LONG_ROW", 10 ** 9)
    whole = (*gemm_core.split_x(x), gemm_core.row_scales(x))
    assert all(torch.equal(a, b) for a, b in zip(chunked, whole))


@pytest.mark.parametrize("slices", [1, 4])
def test_inputs_split_in_the_tile_give_the_partials_of_the_pre_split_operands(slices):
    """split_k_inputs (fp32 operands as they lie, split inside the tile) against split_k_partials on split_x /
    split_weight's parts: the same bits, at odd sizes, for B (K, N) read through its transpose and a strided A with
    rows of very different magnitudes (each row and column its own power of two)."""
    from kfuse.kernels.gemm_core import split_weight, split_x
    from kfuse.kernels.long_k import split_k_inputs, split_k_partials

    torch.manual_seed(3)
    M, N, K = 37, 70, 1000
    a = (torch.randn(M, 2 * K) * torch.logspace(-4, 4, M)[:, None])[:, ::2]  # stride 2 along K
    b = torch.randn(K, N) * torch.logspace(3, -3, N)[None, :]
    cfg = GemmConfig(32, 64, 64, 8, 4, 3, split_a=False, k_slices=slices)
    inside, strides = split_k_inputs(a, b.t(), cfg)
    pre, pre_strides = split_k_partials(split_x(a.contiguous()), split_weight(b.t()), K, "fp16x3p", cfg)
    assert strides == pre_strides and torch.equal(inside, pre)
    ref = a.double() @ b.double()
    assert (inside.double().sum(0) - ref).abs().max() <= 2 * ((a @ b).double() - ref).abs().max() + 1e-6
