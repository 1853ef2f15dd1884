"""benchmarks/conv/kernel_profile.py: where a problem's time goes, kernel by kernel (checked here on the CPU, where
the profiler sees torch ops; the GPU run reads kernels)."""

import importlib.util
import json

from kfuse_testing import ROOT

SPEC = importlib.util.spec_from_file_location("kernel_profile", ROOT / "benchmarks" / "conv" / "kernel_profile.py")
kp = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(kp)


def test_each_model_gets_a_table_and_a_bad_file_a_record(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("this is not python\n")
    out = tmp_path / "p.json"
    rc = kp.main([str(out), str(ROOT / "problems" / "conv" / "01_conv2d_relu.py"), str(bad), "--runs", "2",
                  "--warmup", "1", "--set", "batch_size=2"])
    recs = json.loads(out.read_text())["records"]
    assert rc == 1 and [r["file"] for r in recs] == ["01_conv2d_relu.py", "broken.py"] and "error" in recs[1]
    eager, fused = recs[0]["eager"], recs[0]["kfuse"]
    assert any("conv2d" in k["kernel"] for k in eager["kernels"])  # eager's conv op, on the CPU
    assert not any("conv2d" in k["kernel"] for k in fused["kernels"])  # kfuse's is a Triton kernel, not torch's
    for prof in (eager, fused):
        times = [k["us_per_call"] for k in prof["kernels"]]
        assert prof["wall_ms_per_call"] > 0 and times == sorted(times, reverse=True)
