"""`eval-suite --ray`: the same records from Ray tasks as from a local run (a local Ray cluster, CPU)."""

from __future__ import annotations

import pytest

from kfuse.judge import sandbox
from kfuse.judge.evaluate import EvalConfig
from kfuse.judge.suite import load_run, run_suite

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'kfuse[ray]')")
CFG = EvalConfig(device="cpu", trials=1, seed=11, timeout_s=120, sandboxed=sandbox.unavailable() is None)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, object_store_memory=200 * 1024 * 1024, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield
    ray.shutdown()


def _comparable(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in ("elapsed_s", "phases_s")}


def test_ray_records_match_local_records(cluster, tmp_path, suite_folders):
    refs, cands = suite_folders({"scale_relu": ("scale_relu", "honest_scale"), "crash": ("linear_relu", "segfault"),
                                 "missing": ("linear_relu", None)})
    local = run_suite(refs, cands, CFG, tmp_path / "local.db")
    remote = run_suite(refs, cands, CFG, tmp_path / "ray.db", ray_address="auto")
    assert [r.problem for r in remote.records] == ["crash", "missing", "scale_relu"]
    assert [_comparable(r.to_json()) for r in remote.records] == [_comparable(r.to_json()) for r in local.records]
    assert remote.fast_p == local.fast_p and remote.fast_p["fast_0"] == pytest.approx(1 / 3)
    _, rows = load_run(tmp_path / "ray.db")
    assert [r["problem"] for r in rows] == ["crash", "missing", "scale_relu"]
    assert "SIGSEGV" in rows[0]["error"] and rows[2]["correct"]
