"""Stage 3, rewrite: exact algebraic rewrites, as a list of named rules.

Each rule is (name, match, replace): `match(node, graph)` says whether it applies, `replace(node, graph)`
returns the replacement node with the same name (so users need no rewiring). Only rewrites that are exact
in real arithmetic belong here; the verify stage still checks the result against the contract.
The names of the rules that fired are listed in the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kfuse.ir import Graph, Node, Scalar


@dataclass(frozen=True)
class Rule:
    name: str
    doc: str
    match: Callable[[Node, Graph], bool]
    replace: Callable[[Node, Graph], Node]


def _is_literal(a: object) -> bool:
    return isinstance(a, Scalar) and a.attr is None


def _self_add(n: Node, g: Graph) -> bool:
    return n.op == "add" and len(n.args) == 2 and isinstance(n.args[0], str) and n.args[0] == n.args[1]


def _fold_scalar_mul(n: Node, g: Graph) -> bool:
    """mul(mul(v, c1), c2) with literal constants, the inner product used only here."""
    if n.op != "mul" or not isinstance(n.args[0], str) or not _is_literal(n.args[1]):
        return False
    if n.args[0] in g.inputs:
        return False
    inner = g.node(n.args[0])
    return inner.op == "mul" and isinstance(inner.args[0], str) and _is_literal(inner.args[1]) and g.use_count(inner.name) == 1


def _fold_mul(n: Node, g: Graph) -> Node:
    inner = g.node(n.args[0])
    return n.with_(args=(inner.args[0], Scalar(inner.args[1].value * n.args[1].value)), origin=f"{inner.origin} * {n.origin}")


RULES: list[Rule] = [
    Rule("x+x->2x", "x + x is 2 * x exactly (doubling is exact in binary floating point)",
         _self_add, lambda n, g: n.with_(op="mul", args=(n.args[0], Scalar(2.0)))),
    Rule("fold-scalar-mul", "(x * c1) * c2 -> x * (c1 * c2) for literal constants",
         _fold_scalar_mul, _fold_mul),
]


def _drop_dead(g: Graph) -> Graph:
    """Remove nodes nothing uses any more (left behind by folds), keeping unknown ops (they may have effects)."""
    nodes = list(g.nodes)
    changed = True
    while changed:
        changed = False
        live = {a for n in nodes for a in n.value_args()} | set(g.outputs)
        keep = [n for n in nodes if n.name in live or n.op == "unknown"]
        changed = len(keep) != len(nodes)
        nodes = keep
    return g.with_nodes(nodes)


def rewrite(g: Graph, rules: list[Rule] = RULES) -> tuple[Graph, list[str]]:
    """Apply the rules until none fires; return the new graph and the names of the rules applied."""
    applied: list[str] = []
    progress = True
    while progress:
        progress = False
        for i, node in enumerate(g.nodes):
            rule = next((r for r in rules if r.match(node, g)), None)
            if rule is not None:
                nodes = list(g.nodes)
                # fx_code no longer matches: a torch fallback of this node is emitted from the op table
                nodes[i] = rule.replace(node, g).with_(fx_code="")
                g = _drop_dead(g.with_nodes(nodes))
                applied.append(rule.name)
                progress = True
                break
    return g, applied
