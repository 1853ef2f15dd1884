"""Merge `kfuse bench --json` files measured in several GPU calls into one, and plot speedups per problem.

    python benchmarks/merge_bench.py OUT.json IN.json [IN.json ...] [--plot OUT.png] [--table]

The device lends at most 10 minutes per command, and `kfuse bench` with max-autotune baselines takes one to
two minutes per full-size problem, so the family is measured in chunks. The merged file keeps the bench JSON's
shape ({gpu, torch, triton, command, kfuse, date, mode, method, results}); `command` lists each chunk's command,
joined by " ; ", and `commit` each chunk's commit the same way where the chunks record one (`versions` is kept
where every chunk has the same). A problem measured twice keeps the later file's result. Every input must come from
the same GPU kind and versions (checked), so the ratios stay side-by-side measurements.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

SAME = ("gpu", "torch", "triton", "mode")


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several; raises ValueError when they differ in GPU, versions or mode."""
    first = reports[0]
    for r in reports[1:]:
        diff = [k for k in SAME if r.get(k) != first.get(k)]
        if diff:
            raise ValueError(f"reports differ in {', '.join(diff)}: not one side-by-side measurement")
    by_name: dict[str, dict[str, Any]] = {}
    for r in reports:
        for res in r["results"]:
            by_name[res["problem"]] = res
    out = {k: first.get(k) for k in ("gpu", "torch", "triton", "kfuse", "mode", "method")}
    out["command"] = " ; ".join(r["command"] for r in reports)
    if any("commit" in r for r in reports):
        out["commit"] = " ; ".join(r.get("commit", "unknown") for r in reports)
    if "versions" in first and all(r.get("versions") == first["versions"] for r in reports):
        out["versions"] = first["versions"]
    out["date"] = max(r.get("date", "") for r in reports)
    out["results"] = [by_name[k] for k in sorted(by_name)]
    return out


def with_commit(report: dict[str, Any], path: Path, commits: list[tuple[str, ...]]) -> dict[str, Any]:
    """The report, its `commit` set from the first (folder, sha) whose folder holds `path`, where it records none."""
    if report.get("commit"):
        return report
    sha = next((c for folder, c in commits if Path(folder).resolve() in path.resolve().parents), None)
    return report if sha is None else {**report, "commit": sha}


def geomean(xs: list[float | None]) -> float | None:
    """The geometric mean of the measured values; None (JSON null, not NaN) when none was measured."""
    xs = [x for x in xs if x and x > 0 and not math.isnan(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary(rep: dict[str, Any]) -> dict[str, Any]:
    res = rep["results"]

    def mean(key: str) -> float | None:
        return geomean([r.get(key) for r in res])

    return {
        "problems": len(res),
        "correct": sum(bool(r["correct"]) for r in res),
        "geomean_vs_eager": mean("speedup_vs_eager"),
        "geomean_vs_eager_strict": mean("speedup_vs_eager_strict"),
        "geomean_vs_compile_default": mean("speedup_vs_compile_default"),
        "geomean_vs_max_autotune": mean("speedup_vs_compile_max_autotune"),
        # how many problems each mean is over: a baseline run on a sample says so
        "measured": {k: sum(r.get(f"speedup_vs_{k}") is not None for r in res)
                     for k in ("eager", "eager_strict", "compile_default", "compile_max_autotune")},
        # only problems where max-autotune was measured: a missing baseline is no loss to it
        "slower_than_max_autotune": [r["problem"] for r in res
                                     if r.get("speedup_vs_compile_max_autotune") is not None
                                     and r["speedup_vs_compile_max_autotune"] <= 1.0],
        "failed_contract": [r["problem"] for r in res if not r["correct"]],
    }


def table(rep: dict[str, Any]) -> str:
    """A markdown table of the merged results (for notes and closing reports)."""
    rows = ["| problem | eager ms | strict ms | compile ms | max-autotune ms | kfuse ms | vs eager | vs strict | "
            "vs compile | vs max-autotune | correct |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]

    def f(v: Any, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    def x(v: Any) -> str:
        return "n/a" if v is None else f"{v:.2f}x"

    for r in rep["results"]:
        bad = [k for k, v in (r.get("contract_rules") or {}).items() if v is False]
        ok = "yes" if r["correct"] else f"NO ({', '.join(bad) or 'error'})"
        rows.append(f"| {r['problem']} | {f(r['eager_ms'], '.3f')} | {f(r.get('eager_strict_ms'), '.3f')} | "
                    f"{f(r['compile_default_ms'], '.3f')} | {f(r['compile_max_autotune_ms'], '.3f')} | "
                    f"{f(r['kfuse_ms'], '.3f')} | {x(r.get('speedup_vs_eager'))} | "
                    f"{x(r.get('speedup_vs_eager_strict'))} | {x(r.get('speedup_vs_compile_default'))} | "
                    f"{x(r.get('speedup_vs_compile_max_autotune'))} | {ok} |")
    return "\n".join(rows)


# the bars a plot may draw, in order: (result key, colour, label); a baseline no result has is left out
PLOT_BARS = (("speedup_vs_eager", "#7f7f7f", "vs eager (torch's default flags)"),
             ("speedup_vs_eager_strict", "#bcbd22", "vs eager strict fp32"),
             ("speedup_vs_compile_default", "#1f77b4", "vs torch.compile default"),
             ("speedup_vs_compile_max_autotune", "#9467bd", "vs torch.compile max-autotune"))


def plot(rep: dict[str, Any], path: Path) -> None:
    """Horizontal bars: kfuse's speedup over each baseline the results have, a group per problem; the title names
    the GPU, the code (commit) and the versions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = rep["results"]
    names = [r["problem"] + ("" if r["correct"] else "  [FAILED contract]") for r in res]
    bars = [b for b in PLOT_BARS if any(r.get(b[0]) for r in res)]
    ys = range(len(res))
    height = 0.8 / max(len(bars), 1)
    fig, ax = plt.subplots(figsize=(9, 0.16 * len(bars) * len(res) + 2.0))
    for i, (key, color, label) in enumerate(bars):
        vals = [r.get(key) or 0.0 for r in res]
        ax.barh([y - 0.4 + (i + 0.5) * height for y in ys], vals, height=height, color=color, label=label)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    s = summary(rep)
    ax.set_xlabel("kfuse speedup (x, median ms ratio)")
    means = ", ".join(f"{geomean(v):.2f}x {label[3:]}" for key, _, label in bars
                      if (v := [r[key] for r in res if r.get(key)]))
    versions = rep.get("versions") or {k: rep[k] for k in ("torch", "triton") if k in rep}
    commits = " ; ".join(dict.fromkeys(rep.get("commit", "?").split(" ; ")))  # each chunk's, once
    head = f"kfuse bench on {rep['gpu']}, commit {commits}, " + ", ".join(f"{k} {v}" for k, v in versions.items())
    ax.set_title("\n".join([head, f"{s['correct']}/{s['problems']} meet the contract; geometric means:",
                            means, "(the commands: the JSON's `command`)"]), fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("inputs", type=Path, nargs="+")
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--table", action="store_true", help="print a markdown table and the summary")
    ap.add_argument("--commit", action="append", default=[], metavar="FOLDER=SHA",
                    help="the commit a GPU call ran, for its files under FOLDER that record none (a device copy of the "
                         "tree has no git metadata); repeatable")
    a = ap.parse_args(argv)
    try:
        commits = [tuple(c.split("=", 1)) for c in a.commit]
        if any(len(c) != 2 for c in commits):
            raise ValueError(f"--commit takes FOLDER=SHA, got {a.commit}")
        rep = merge([with_commit(json.loads(p.read_text()), p, commits) for p in a.inputs])
    except (OSError, ValueError, KeyError) as err:
        print(f"merge_bench: {err}", file=sys.stderr)
        return 2
    a.out.write_text(json.dumps(rep, indent=2) + "\n")
    if a.plot:
        plot(rep, a.plot)
    if a.table:
        print(table(rep))
        print(json.dumps(summary(rep), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
