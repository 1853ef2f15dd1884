"""Stage 3b, modes: the forwards ModelNew dispatches between by the mode of its Dropouts.

Dropout draws torch's random mask in training mode and is the identity in eval mode. Where a model has a
Dropout that follows the mode (an nn.Dropout module, or F.dropout(..., training=self.training)), kfuse builds
two forwards from the one captured graph:
  - "train": the Dropout stays a torch call (torch draws the mask), the rest as usual;
  - "eval": the Dropout is gone (rule `dropout-eval`), so the ops around it join one region, and rewrites it
    blocked can apply (a mean over a Linear's features becomes a GEMV).
ModelNew.forward runs "train" while any of those Dropouts is in training mode (the guards) and "eval"
otherwise. A model with no such Dropout gets one forward, "any". The contract is checked on the forward of
the mode the model is constructed in (`primary`); the report lists the other one's regions too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kfuse.ir import Graph, Region, attr_expr
from kfuse.partition import partition
from kfuse.regions import KINDS, call_time_rewrites
from kfuse.regions.kind import RegionKind
from kfuse.rewrite import EVAL_RULES, RULES, Rule, follows_mode, rewrite


@dataclass(frozen=True)
class Variant:
    mode: str  # "any" (the only forward), "train" or "eval"
    graph: Graph
    regions: tuple[Region, ...]
    rewrites: tuple[str, ...]

    @property
    def unfused(self) -> list[str]:
        return [n.origin for r in self.regions if r.unfused for n in r.nodes]


def guards(g: Graph) -> tuple[str, ...]:
    """The flags that select the "train" forward: each mode-following Dropout's `training`."""
    return tuple(dict.fromkeys(f"{attr_expr(n.module)}.training" if n.module else "self.training"
                               for n in g if follows_mode(n)))


def _variant(mode: str, g: Graph, rules: list[Rule], kinds: Sequence[RegionKind]) -> Variant:
    out, applied = rewrite(g, rules)
    regions = partition(out, kinds)
    return Variant(mode, out, tuple(regions), tuple(applied + call_time_rewrites(regions, kinds)))


def variants(g: Graph, kinds: Sequence[RegionKind] = KINDS) -> tuple[Variant, ...]:
    """One forward, or the "train" and "eval" pair (guards read from the rewritten graph: Dropouts with
    p = 0 or training=False are gone by then). `kinds`: the region registry partition walks with."""
    train = _variant("train", g, RULES, kinds)
    if not guards(train.graph):
        return (replace(train, mode="any"),)
    return train, _variant("eval", g, EVAL_RULES + RULES, kinds)


def primary(vs: tuple[Variant, ...]) -> Variant:
    """The forward the model runs as constructed (capture recorded each Dropout's mode): "eval" only if every
    mode-following Dropout was in eval mode."""
    if len(vs) == 1:
        return vs[0]
    train = next(v for v in vs if v.mode == "train")
    training = any(n.attrs.get("captured_training", True) for n in train.graph if follows_mode(n))
    return train if training else next(v for v in vs if v.mode == "eval")
