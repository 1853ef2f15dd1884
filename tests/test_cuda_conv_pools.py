"""`--backend cuda`'s pool after a convolution (kfuse/cuda/conv_pools.py, conv_pools_source.py): convolution -> ops ->
a windowed pool -> ops (-> a global mean of its values -> ops), or convolution -> ops -> a global mean -> ops, as the
convolution's launches storing the pool's input, then kf_window_pool (a thread a pooled value) and the mean's
kf_row_stats<0> and kf_rows. Off unless KFUSE_CUDA_CONV_POOLS=1 (it met the contract on an H200, gpu_sm90.sh OUT
convpools, and lost its A/B against the pool as a torch call).

Without a GPU: the switch decides the partition and the reason given for the torch call; switched on, each file is
one region and complete on both convolution tiles; the pool kernel's arithmetic, modelled in torch, agrees with
torch's max and avg pools at padded, dilated, ceil-mode, count_include_pad and divisor_override geometries; the CUDA
source compiles with nvcc for sm_80 and sm_90 without spills, the C++ glue with g++; autograd through the generated
Function with torch in place of the kernels meets the gradient contract. With a GPU: the files meet the accuracy
contract.
"""

from __future__ import annotations

import itertools
import math
import re
import shutil
import subprocess

import pytest
import torch

from kfuse.cuda.regions import unfused_reasons
from kfuse.kernels.conv_geometry import conv_geometry
from kfuse.kernels.pool_geometry import pool_geometry
from kfuse.regions.conv_pool import TRANSPOSED_SWITCH
from kfuse_testing import ROOT, requires_cuda
from test_conv_pool_transposed import problem as transposed_problem
from test_cuda_backend import _contract, check_emitted, compile_cuda, cpp_syntax_errors
from test_cuda_conv import built_without_spills, sources, torch_in_place_gradients

CONV = ROOT / "problems" / "conv"
SWITCH = "KFUSE_CUDA_CONV_POOLS"
# an overlapping MaxPool2d, an AvgPool3d, a global average pool, an AvgPool1d with ceil_mode and no padding counted
POOL_FILES = ["44_conv2d_hardswish_maxpool_overlapping_mish", "45_conv3d_avgpool3d_sigmoid_bias",
              "46_conv2d_gelu_global_avgpool_scale", "47_conv1d_batch1_avgpool_ceil_nopad_count"]
PACKED = {"in_channels": 16}  # 16 input channels: the implicit-GEMM tile


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setenv(SWITCH, "1")


@pytest.fixture
def off(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)  # off by default


def pool_then_mean_problem(tmp_path):
    """A Conv3d, a MaxPool3d, a global mean of the pooled values, a per-channel bias (KernelBench level 2 8's shape of
    region), at odd sizes."""
    path = tmp_path / "pool_then_mean.py"
    path.write_text("""
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels=5, out_channels=7):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, 3)
        self.pool = nn.MaxPool3d(2)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1, 1))

    def forward(self, x):
        x = self.pool(self.conv(x) / 2.0)
        return torch.mean(x, dim=(2, 3, 4), keepdim=True) + self.bias

def get_inputs():
    return [torch.randn(3, 5, 9, 11, 8)]

def get_init_inputs():
    return []
""")
    return path


@pytest.mark.parametrize("name", POOL_FILES)
def test_off_by_default_the_pool_stays_a_torch_call_with_the_reason(off, name):
    (v,) = compile_cuda(CONV / f"{name}.py").variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_epilogue"]
    reasons = list(unfused_reasons(v).values())
    assert reasons and all(f"its CUDA version is off unless {SWITCH}=1" in why for why in reasons), reasons


@pytest.mark.parametrize("overrides", [{}, PACKED], ids=["own", "packed"])
@pytest.mark.parametrize("name", POOL_FILES)
def test_switched_on_the_region_is_one_and_the_file_complete(on, name, overrides):
    compiled = compile_cuda(CONV / f"{name}.py", overrides)
    (v,) = compiled.variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_pool"] and not v.unfused
    check_emitted(compiled.source)
    windowed = "global" not in name
    assert ("kf_window_pool<" in compiled.source) == windowed
    assert ("kf_rows(B * C, st_a, row, stream, C)" in compiled.source) == (not windowed)
    if overrides:
        assert "return kf_conv(g, epi, stream);" in compiled.source


def test_a_mean_of_the_pooled_values_runs_both_passes(on, tmp_path):
    compiled = compile_cuda(pool_then_mean_problem(tmp_path))
    (v,) = compiled.variants
    assert [r.kind for r in v.regions if r.fused] == ["conv_pool"] and not v.unfused
    check_emitted(compiled.source)
    assert "kf_window_pool<true>" in compiled.source
    assert "kf_row_stats<0>(post.out0, B * C, post.P" in compiled.source


# ---- the pool kernel's arithmetic, modelled in torch on the CPU ----------------------------------------------------
def window_pool(y: torch.Tensor, pool, is_max: bool, divisor: int, count_pad: bool) -> torch.Tensor:
    """kf_window_pool_kernel on y (N, C, OD, OH, OW), as it computes: each pooled value from its window's positions
    inside the plane (PoolGeometry's order of sizes), then torch's avg_pool divisor."""
    _, qd_n, qh_n, qw_n, kd_n, kh_n, kw_n, sd, sh, sw, pd, ph, pw, dd, dh, dw = pool.args()
    od_n, oh_n, ow_n = y.shape[2:]
    out = torch.empty(*y.shape[:2], qd_n, qh_n, qw_n)
    for qd, qh, qw in itertools.product(range(qd_n), range(qh_n), range(qw_n)):
        d0, h0, w0 = qd * sd - pd, qh * sh - ph, qw * sw - pw
        v = torch.full(y.shape[:2], -math.inf if is_max else 0.0)
        for kd, kh, kw in itertools.product(range(kd_n), range(kh_n), range(kw_n)):
            od, oh, ow = d0 + kd * dd, h0 + kh * dh, w0 + kw * dw
            if 0 <= od < od_n and 0 <= oh < oh_n and 0 <= ow < ow_n:
                x = y[:, :, od, oh, ow]
                v = torch.where(torch.isnan(v) | torch.isnan(x), v + x, torch.maximum(v, x)) if is_max else v + x
        if not is_max:
            a1, b1, c1 = min(d0 + kd_n, od_n + pd), min(h0 + kh_n, oh_n + ph), min(w0 + kw_n, ow_n + pw)
            a0, b0, c0 = d0, h0, w0
            if not count_pad:
                a0, b0, c0, a1, b1, c1 = max(a0, 0), max(b0, 0), max(c0, 0), min(a1, od_n), min(b1, oh_n), min(c1, ow_n)
            v = v / (divisor if divisor else (a1 - a0) * (b1 - b0) * (c1 - c0))
        out[:, :, qd, qh, qw] = v
    return out


GEOMETRIES = [  # (dims, kernel_size, stride, padding, dilation, ceil_mode)
    (2, 3, 2, 1, 1, False), (2, (3, 2), (2, 1), (1, 0), (2, 1), True), (1, 4, 3, 2, 1, True),
    (3, 2, None, 0, 1, False), (3, (3, 2, 3), (2, 2, 1), (1, 1, 0), 1, True)]


def agrees_with_torch(pool_fn, geometry) -> None:
    """pool_fn(y (N, C, OD, OH, OW), pool, is_max, divisor, count_pad) against torch's max and avg pools at the
    geometry: NaN, padding, dilation, ceil_mode, count_include_pad, divisor_override."""
    dims, k, s, p, d, ceil = geometry
    spatial = (7, 9, 8)[3 - dims:]
    y = torch.randn(2, 3, *spatial)
    y[(0, 1, *(0,) * dims)] = math.nan
    geo = conv_geometry((2, 3, *spatial), (3, 3, *(1,) * dims), 1, 0, 1, 1)
    pool = pool_geometry(geo, k, s, p, d, ceil)
    y3 = y.reshape(2, 3, *(1,) * (3 - dims), *spatial)
    f = torch.nn.functional
    max_ref = getattr(f, f"max_pool{dims}d")(y, k, s, p, d, ceil_mode=ceil)
    got = pool_fn(y3, pool, True, 0, True).reshape(pool.out_shape)
    assert got.shape == max_ref.shape and torch.allclose(got, max_ref, equal_nan=True)
    if d == 1:  # avg pools have no dilation
        y = torch.nan_to_num(y)
        for count_pad, divisor in ((True, 0), (False, 0), (True, 5)):
            kwargs = {"ceil_mode": ceil, "count_include_pad": count_pad}
            if divisor and dims > 1:
                kwargs["divisor_override"] = divisor
            elif divisor:
                continue  # avg_pool1d takes no divisor_override
            ref = getattr(f, f"avg_pool{dims}d")(y, k, s, p, **kwargs)
            got = pool_fn(y.reshape(y3.shape), pool, False, divisor, count_pad).reshape(pool.out_shape)
            assert torch.allclose(got, ref, rtol=1e-6, atol=1e-6), (count_pad, divisor)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_the_modelled_pool_agrees_with_torch(geometry):
    agrees_with_torch(window_pool, geometry)


# kf_window_pool_at (the kernel's whole per-value work) compiled by nvcc for the host, run over every pooled value
HOST_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
struct KfHostPost {  // the pooled value v of channel n at m = b C Q + q into out (N, C, Q)
  float* out;
  long long Q;
  struct Col {};
  Col column(long long) const { return Col{}; }
  void operator()(const Col&, long long m, long long n, float v) const { out[m + n * Q] = v; }
};
template <bool MAX, class I>
void kf_host_pool(const std::vector<float>& y, std::vector<float>& out, long long C, const KfPoolGeo& g) {
  const KfHostPost post{out.data(), g.QD * g.QH * g.QW};
  for (long long i = 0; i < (long long)out.size(); ++i) kf_window_pool_at<MAX, I>(y.data(), (I)C, (I)i, g, post);
}
// argv: y.bin out.bin max(0/1) bits(32/64) B C OD OH OW, then PoolGeometry.args()[1:] (15), divisor, count_pad
int main(int argc, char** argv) {
  if (argc != 27) return 2;
  long long v[24];
  for (int k = 0; k < 24; ++k) v[k] = atoll(argv[3 + k]);
  const long long B = v[2], C = v[3];
  long long geo[16] = {0};
  for (int k = 1; k < 16; ++k) geo[k] = v[6 + k];
  const KfPoolGeo g = kf_pool_geo(v[4], v[5], v[6], geo, (int)v[22], v[23] != 0);
  std::vector<float> y(B * C * v[4] * v[5] * v[6]), out(B * C * g.QD * g.QH * g.QW);
  FILE* f = fopen(argv[1], "rb");
  if (!f || fread(y.data(), sizeof(float), y.size(), f) != y.size()) return 3;
  fclose(f);
  if (v[0]) v[1] == 32 ? kf_host_pool<true, int>(y, out, C, g) : kf_host_pool<true, long long>(y, out, C, g);
  else v[1] == 32 ? kf_host_pool<false, int>(y, out, C, g) : kf_host_pool<false, long long>(y, out, C, g);
  f = fopen(argv[2], "wb");
  fwrite(out.data(), sizeof(float), out.size(), f);
  fclose(f);
  return 0;
}
"""


@pytest.fixture(scope="module")
def host_pool(tmp_path_factory):
    """The pool's per-value CUDA function, built for the CPU: (y, pool, max?, bits, divisor, count_pad) -> pooled."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc (the CUDA toolkit)")
    from kfuse.cuda.conv_pools_source import CONV_POOLS
    from kfuse.cuda.rows_source import ROWS

    folder = tmp_path_factory.mktemp("host_pool")
    nan_ops = re.search(r"__host__ __device__ __forceinline__ float kf_nan_max.*?\n}\n", ROWS, re.S).group(0)
    (folder / "pool.cu").write_text("#include <cuda_runtime.h>\n" + nan_ops + CONV_POOLS + HOST_MAIN)
    r = subprocess.run(["nvcc", "-std=c++17", "-O1", "pool.cu", "-o", "pool"], cwd=folder, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-4000:]

    def run(y: torch.Tensor, pool, is_max: bool, bits: int, divisor: int, count_pad: bool) -> torch.Tensor:
        (folder / "y.bin").write_bytes(y.float().contiguous().numpy().tobytes())
        sizes = [int(is_max), bits, *y.shape[:2], *y.shape[2:], *pool.args()[1:], divisor, int(count_pad)]
        subprocess.run([str(folder / "pool"), "y.bin", "out.bin", *map(str, sizes)], cwd=folder, check=True)
        out = torch.frombuffer(bytearray((folder / "out.bin").read_bytes()), dtype=torch.float32)
        return out.reshape(pool.out_shape)

    return run


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_the_pool_code_run_on_the_cpu_agrees_with_torch(host_pool, geometry, bits):
    """kf_window_pool_at itself, in either index type."""
    agrees_with_torch(lambda y, pool, is_max, divisor, count_pad: host_pool(y, pool, is_max, bits, divisor, count_pad),
                      geometry)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_a_pool_after_a_transposed_convolution_compiles(on, tmp_path, monkeypatch):
    """With the registry kind's KFUSE_TRANSPOSED_POOLS=1 too: the convolution's phase launches store y, then the
    pool pass (complete, built by nvcc for sm_90 without spills; not run on a GPU)."""
    monkeypatch.setenv(TRANSPOSED_SWITCH, "1")
    compiled = compile_cuda(transposed_problem(tmp_path, "2d_max_overlap"))
    assert [r.kind for v in compiled.variants for r in v.regions if r.fused] == ["conv_pool"]
    check_emitted(compiled.source)
    entries = built_without_spills(sources(transposed_problem(tmp_path, "2d_max_overlap"))["CUDA_SRC"], "90", tmp_path)
    assert any("kf_window_pool_kernel" in e for e in entries), entries


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["80", "90"])
def test_pool_source_compiles_without_spills(on, tmp_path, arch):
    """A max pool then a mean of its values (both passes), and problems/conv/45's avg pool on the packed tile."""
    source = sources(pool_then_mean_problem(tmp_path))["CUDA_SRC"]
    entries = built_without_spills(source, arch, tmp_path)
    for kernel in ("kf_window_pool_kernelILb1E", "kf_row_stats_kernelILi0E", "kf_rows_kernel"):
        assert any(kernel in e for e in entries), (kernel, entries)
    avg = sources(CONV / "45_conv3d_avgpool3d_sigmoid_bias.py", PACKED)["CUDA_SRC"]
    assert any("kf_window_pool_kernelILb0E" in e for e in built_without_spills(avg, arch, tmp_path))


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("name", [POOL_FILES[0], POOL_FILES[2]])
def test_pool_cpp_glue_compiles_against_torch_headers(on, tmp_path, name):
    ns = sources(CONV / f"{name}.py", PACKED)
    assert cpp_syntax_errors(ns, tmp_path) == ""


@pytest.mark.parametrize("name", POOL_FILES)
def test_backward_meets_the_gradient_contract_with_torch_in_place_of_the_kernels(on, tmp_path, monkeypatch, name):
    verdict = torch_in_place_gradients(CONV / f"{name}.py", tmp_path, monkeypatch)
    assert verdict.correct, verdict.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("overrides", [{}, PACKED], ids=["own", "packed"])
@pytest.mark.parametrize("name", POOL_FILES)
def test_gpu_pool_files_meet_the_contract(on, name, overrides):
    _, _, contract = _contract(CONV / f"{name}.py", overrides)
    assert contract.correct, contract.failures


@pytest.mark.gpu
@requires_cuda
def test_gpu_a_mean_of_the_pooled_values_meets_the_contract(on, tmp_path):
    _, _, contract = _contract(pool_then_mean_problem(tmp_path), {})
    assert contract.correct, contract.failures
