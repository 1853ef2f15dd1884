"""`kfuse report`: one suite run from the database as a table (rich) and a fast_p chart (PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from kfuse.judge.ipc import clean_text
from kfuse.judge.suite import FAST_P


def cell(text: Any, limit: int = 400) -> str:
    """Candidate-controlled text for the terminal: control characters (escapes, bells) replaced, markup
    escaped, length bounded."""
    return escape(clean_text(text, limit))


def _num(v: Any, fmt: str) -> str:
    if v is None:
        return "-"
    if v == "inf":
        return "inf"
    return format(v, fmt)


def records_table(meta: dict[str, Any], records: Sequence[dict[str, Any]]) -> Table:
    table = Table(title=f"run {meta['id']}  {meta['started']}  {meta['device']} ({cell(meta['gpu'])})  "
                        f"{meta['precision']}  "
                        f"seed {meta['seed']}  torch {meta['torch']}  triton {meta['triton']}  "
                        f"commit {(meta['git_commit'] or '-')[:10]}")
    for col, justify in (("problem", "left"), ("compiled", "center"), ("correct", "center"), ("max abs err", "right"),
                         ("ms", "right"), ("eager ms", "right"), ("vs eager", "right"), ("vs compile", "right"),
                         ("flags / error", "left")):
        table.add_column(col, justify=justify, no_wrap=col == "problem")  # type: ignore[arg-type]
    for r in records:
        note = ", ".join(map(str, r.get("flags") or []))
        if r.get("error"):
            note = (note + "; " if note else "") + (str(r["error"]).splitlines() or [""])[0][:80]
        table.add_row(cell(r["problem"]), "yes" if r["compiled"] else "no",
                      "[green]yes[/]" if r["correct"] else "[red]no[/]", _num(r.get("max_abs_err"), ".2e"),
                      _num(r.get("runtime_ms"), ".4f"), _num(r.get("ref_runtime_ms"), ".4f"),
                      _num(r.get("speedup_eager"), ".2f"), _num(r.get("speedup_compile"), ".2f"), cell(note))
    return table


def fast_p_table(meta: dict[str, Any]) -> Table:
    done = "" if meta.get("finished") else " -- run not finished: fast_p over the records stored so far"
    table = Table(title=f"fast_p over {meta['n_problems']} problems (correct and speedup vs eager > p){done}")
    keys = list(meta["fast_p"])
    for k in keys:
        table.add_column(k, justify="right")
    table.add_row(*[_num(meta["fast_p"][k], ".2f") if meta["fast_p"][k] is not None else "n/a (no timing)"
                    for k in keys])
    return table


def draw_png(runs: Sequence[dict[str, Any]], path: Path) -> Path:
    """fast_p against p, one line per run (newest first in the legend); p > 0 absent without timing."""
    import matplotlib

    matplotlib.use("Agg")  # files only: CI has no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for run in runs:
        pts = [(p, run["fast_p"].get(f"fast_{p:g}")) for p in FAST_P]
        pts = [(p, v) for p, v in pts if v is not None]
        label = f"run {run['id']} ({run['gpu']}, {run['n_problems']} problems)"
        ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", label=label)
    ax.set_xlabel("p (speedup over eager)")
    ax.set_ylabel("fast_p (fraction of problems)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(list(FAST_P))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("kfuse eval-suite: fraction correct and faster than p x eager")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
