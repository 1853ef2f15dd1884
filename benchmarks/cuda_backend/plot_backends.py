"""The CUDA backend against the Triton backend and eager, per problem, from two `kfuse bench --json` files measured in
one GPU call (`benchmarks/cuda_backend/gpu_sm90.sh OUT bench`):

    python3 benchmarks/cuda_backend/plot_backends.py CUDA.json TRITON.json --commit REV --out OUT.png [--merge OUT.json]

--merge writes CUDA.json with each result's Triton-backend time beside it (`triton_ms`, `cuda_over_triton`), the
Triton file's command and the commit. The PNG's title names the GPU, torch, the commit; its footer both commands.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def merged(cuda: dict[str, Any], triton: dict[str, Any], commit: str) -> dict[str, Any]:
    """The CUDA report with the Triton backend's time per problem; the two must come from the same GPU and torch."""
    if (cuda["gpu"], cuda["torch"]) != (triton["gpu"], triton["torch"]):
        raise ValueError("the two reports come from different GPUs or torch versions")
    by_name = {r["problem"]: r for r in triton["results"]}
    out = dict(cuda, commit=commit, triton_command=triton["command"])
    out["results"] = []
    for r in cuda["results"]:
        t = by_name.get(r["problem"], {}).get("kfuse_ms")
        ratio = r["kfuse_ms"] / t if t and r.get("kfuse_ms") else None
        out["results"].append(dict(r, triton_ms=t, cuda_over_triton=ratio))
    return out


def plot(rep: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rep["results"]
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 4.2), squeeze=False)
    for ax, r in zip(axes[0], rows):
        names, values = ["eager", "--backend triton", "--backend cuda"], [r["eager_ms"], r["triton_ms"], r["kfuse_ms"]]
        bars = ax.bar(names, [v or 0 for v in values], color=["grey", "tab:blue", "tab:green"])
        for b, v in zip(bars, values):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), "n/a" if v is None else f"{v:.3f}", ha="center",
                    va="bottom", fontsize=8)
        ratio = r.get("cuda_over_triton")
        ax.set_title(f"{r['problem'][:34]}\ncuda {r['speedup_vs_eager']:.2f}x eager, "
                     f"{'n/a' if ratio is None else f'{ratio:.2f}'}x triton's time", fontsize=9)
        ax.set_ylabel("ms per call (median)")
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"kfuse --backend cuda on {rep['gpu']} (torch {rep['torch']}, commit {rep['commit']})", fontsize=10)
    fig.text(0.01, 0.01, f"{rep['command']}\n{rep['triton_command']}", fontsize=6, family="monospace", va="bottom")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cuda", type=Path)
    ap.add_argument("triton", type=Path)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--merge", type=Path)
    args = ap.parse_args()
    rep = merged(json.loads(args.cuda.read_text()), json.loads(args.triton.read_text()), args.commit)
    if args.merge:
        args.merge.write_text(json.dumps(rep, indent=1) + "\n")
    plot(rep, args.out)


if __name__ == "__main__":
    main()
