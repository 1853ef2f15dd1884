"""benchmarks/merge_bench.py: chunked `kfuse bench --json` files merged into one (no GPU needed)."""

import importlib.util
import json

import pytest

from kfuse_testing import ROOT

SPEC = importlib.util.spec_from_file_location("merge_bench", ROOT / "benchmarks" / "merge_bench.py")
mb = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(mb)


def _rep(cmd, *results, gpu="H100"):
    return {"gpu": gpu, "torch": "t", "triton": "3.6", "kfuse": "0.1", "mode": "forward", "method": "m",
            "date": cmd, "command": cmd, "results": list(results)}


def _res(name, ok=True, vs_eager=2.0, vs_ma=1.5):
    return {"problem": name, "eager_ms": 2.0, "compile_default_ms": 2.0, "compile_max_autotune_ms": 1.5,
            "kfuse_ms": 1.0, "correct": ok, "speedup_vs_eager": vs_eager, "speedup_vs_compile_max_autotune": vs_ma,
            "contract_rules": {"allclose": ok}}


def test_later_file_wins_and_commands_are_kept(tmp_path):
    rep = mb.merge([_rep("a", _res("p2", ok=False), _res("p1")), _rep("b", _res("p2", vs_eager=8.0))])
    assert [r["problem"] for r in rep["results"]] == ["p1", "p2"]
    assert rep["results"][1]["correct"] and rep["command"] == "a ; b"
    s = mb.summary(rep)
    assert s["problems"] == 2 and s["correct"] == 2 and s["geomean_vs_eager"] == pytest.approx(4.0)
    assert "| p2 |" in mb.table(rep)


def test_commits_are_kept_in_order_and_common_versions_carried():
    a, b = _rep("a", _res("p1")), _rep("b", _res("p2"))
    a["commit"], a["versions"] = "c1", {"torch": "t", "triton": "3.6"}
    b["versions"] = {"torch": "t", "triton": "3.6"}
    rep = mb.merge([a, b])
    assert rep["commit"] == "c1 ; unknown" and rep["versions"] == {"torch": "t", "triton": "3.6"}
    b["versions"] = {"torch": "t2", "triton": "3.6"}
    assert "versions" not in mb.merge([a, b]) and "commit" not in mb.merge([_rep("x", _res("p1"))])


def test_failures_are_summarised():
    rep = mb.merge([_rep("a", _res("p1", ok=False, vs_ma=0.5))])
    s = mb.summary(rep)
    assert s["failed_contract"] == ["p1"] and s["slower_than_max_autotune"] == ["p1"]
    assert "NO (allclose)" in mb.table(rep)


def test_a_baseline_not_measured_is_not_a_loss_to_it():
    rep = mb.merge([_rep("a", _res("p1", vs_ma=None), _res("p2", vs_ma=0.9))])
    s = mb.summary(rep)
    assert s["slower_than_max_autotune"] == ["p2"] and s["measured"]["compile_max_autotune"] == 1
    assert s["geomean_vs_max_autotune"] == pytest.approx(0.9) and s["geomean_vs_compile_default"] is None
    assert "| n/a |" in mb.table(rep) and "n/ax" not in mb.table(rep)


def test_different_gpus_are_refused(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_rep("a", _res("p1"))))
    b.write_text(json.dumps(_rep("b", _res("p2"), gpu="H200")))
    assert mb.main([str(tmp_path / "out.json"), str(a), str(b)]) == 2
    assert "differ in gpu" in capsys.readouterr().err and not (tmp_path / "out.json").exists()


def test_plot_draws_the_baselines_the_results_have(tmp_path, monkeypatch):
    """Bars only for the baselines measured (no max-autotune here: no nan in the title); commit, versions in it."""
    res = _res("p1")
    del res["speedup_vs_compile_max_autotune"]
    res["speedup_vs_eager_strict"] = 3.0
    rep = mb.merge([_rep("a", res)])
    rep["commit"] = "abc1234"
    titles, labels = [], []
    import matplotlib.axes
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda self, t, **kw: titles.append(t))
    original = matplotlib.axes.Axes.barh
    monkeypatch.setattr(matplotlib.axes.Axes, "barh",
                        lambda self, *a, **kw: labels.append(kw["label"]) or original(self, *a, **kw))
    mb.plot(rep, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    assert labels == ["vs eager (torch's default flags)", "vs eager strict fp32"]
    title = titles[0]
    assert "abc1234" in title and "torch t" in title and "nan" not in title and "3.00x eager strict" in title


def test_a_call_commit_is_set_by_folder(tmp_path):
    a, b = tmp_path / "call1" / "a.json", tmp_path / "call2" / "b.json"
    for path, rep in ((a, _rep("a", _res("p1"))), (b, _rep("b", _res("p2")))):
        path.parent.mkdir()
        path.write_text(json.dumps(rep))
    out = tmp_path / "m.json"
    assert mb.main([str(out), str(a), str(b), "--commit", f"{tmp_path / 'call1'}=abc1234"]) == 0
    assert json.loads(out.read_text())["commit"] == "abc1234 ; unknown"
    assert mb.main([str(out), str(a), "--commit", "nosha"]) == 2
