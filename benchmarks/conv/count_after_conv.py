"""Which op comes right after a convolution's fused pointwise chain in KernelBench level 2 (issue 20 item 2)?

For every file with a Conv*/ConvTranspose* module, capture and partition it as `kfuse optimize` does (meta device,
no kernel runs) and name the first node outside the conv region that reads one of its values: the op a conv kind
would have to take next. Prints one line per file and the counts, most frequent first.

    .venv/bin/python benchmarks/conv/count_after_conv.py ../shared/kernelbench/level2
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from kfuse.load import load_problem
from kfuse.modes import primary, variants
from kfuse.optimize import capture_problem


def next_op(path: Path) -> tuple[str, str]:
    """(the conv region's kind and op count, the canonical op of the first node reading the region), or a
    reason in their place."""
    g = capture_problem(load_problem(path), "cpu")
    v = primary(variants(g))
    conv = next((r for r in v.regions if r.anchor.op in ("conv", "conv_transpose")), None)
    if conv is None:
        return "no conv region", "-"
    inside = {n.name for n in conv.nodes}
    after = next((n for n in v.graph.nodes if n.name not in inside and set(n.value_args()) & inside), None)
    if after is None:
        return f"{conv.kind}({len(conv.nodes)})", "(output)"
    # an op capture has no canonical name for is named as the user wrote it (nn.MaxPool2d, torch.max, ...)
    op = after.op if after.op != "unknown" else after.origin.split(" ")[0].split("(")[0]
    if "dim" in after.attrs:  # reductions: over which dims (1: the channels)
        op += f" dim={after.attrs['dim']}"
    return f"{conv.kind}({len(conv.nodes)})", op


def main(folder: str) -> None:
    counts: Counter[str] = Counter()
    for path in sorted(Path(folder).glob("*.py")):
        if "Conv" not in path.read_text():
            continue
        try:
            region, op = next_op(path)
        except Exception as err:  # noqa: BLE001 - one line per file whatever happens
            region, op = "error", type(err).__name__
        counts[op] += 1
        print(f"{path.stem}\t{region}\t{op}")
    print("\nop after the conv region\tfiles")
    for op, k in counts.most_common():
        print(f"{op}\t{k}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/kernelbench/level2")
