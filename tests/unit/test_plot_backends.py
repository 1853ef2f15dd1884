"""benchmarks/cuda_backend/plot_backends.py: the CUDA backend's bench report beside the Triton backend's (no GPU)."""

import importlib.util

import pytest

from kfuse_testing import ROOT

SPEC = importlib.util.spec_from_file_location("plot_backends", ROOT / "benchmarks/cuda_backend/plot_backends.py")
pb = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(pb)


def _rep(backend, *times, gpu="H100"):
    return {"gpu": gpu, "torch": "t", "command": f"kfuse bench --backend {backend}",
            "results": [{"problem": f"p{i}", "eager_ms": 4.0, "kfuse_ms": t, "speedup_vs_eager": 4.0 / t}
                        for i, t in enumerate(times)]}


def test_cuda_time_over_triton_per_problem_and_a_plot(tmp_path):
    rep = pb.merged(_rep("cuda", 1.0, 3.0), _rep("triton", 0.8), "abc1234")
    assert [r["triton_ms"] for r in rep["results"]] == [0.8, None]
    ratios = [r["cuda_over_triton"] for r in rep["results"]]
    assert ratios[0] == pytest.approx(1.25) and ratios[1] is None
    assert rep["commit"] == "abc1234" and rep["triton_command"] == "kfuse bench --backend triton"
    pb.plot(rep, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reports_from_different_gpus_are_refused():
    with pytest.raises(ValueError, match="different GPUs"):
        pb.merged(_rep("cuda", 1.0), _rep("triton", 1.0, gpu="H200"), "abc")
