"""Stage 2a, trace: Model.forward -> a torch.fx graph kfuse can convert, or `Untraceable` with the reason.

torch.fx records the ops a forward runs on proxies. Three things stop it or make its graph unsafe to fuse:
  - Python that needs real values (`if x.sum() > 0`, a loop over a tensor's rows) inside a submodule: that
    submodule becomes a leaf of the trace (called as it is, its ops a torch call) and the rest is traced;
    the same inside the root forward itself: nothing can be traced, `Untraceable`;
  - a forward that assigns module attributes (`self.hidden = ...`): state carried from call to call, which a
    graph does not replay: `Untraceable`;
  - in-place writes (`x += y`, `x.relu_()`, `nn.ReLU(inplace=True)`): the graph names values, not storage, so a
    later read of the written tensor must read the write's result (`functionalize`). Where the write reaches a
    parameter, or storage another live view shares, no rewiring of names is exact: `Untraceable`.
An `Untraceable` model still gets a ModelNew: one that runs Model.forward unchanged, with the reason reported.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

MAX_LEAVES = 64  # submodules made leaves before giving up (each costs one more trace)


class Untraceable(Exception):
    """Model.forward cannot be captured as a graph kfuse may fuse; str(err) is the reason, one line."""


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


class _Tracer(fx.Tracer):
    """torch.fx's tracer, with chosen submodules kept whole and a record of which module was being traced."""

    def __init__(self, leaves: frozenset[str]) -> None:
        super().__init__()
        self.leaves = leaves
        self.stack: list[str] = []
        self.failed_in: str | None = None

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return qualname in self.leaves or super().is_leaf_module(m, qualname)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        qualname = self.path_of_module(m)
        if self.is_leaf_module(m, qualname):
            return super().call_module(m, forward, args, kwargs)
        self.stack.append(qualname)
        try:
            out = super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_in is None:  # the innermost module the failure passed through
                self.failed_in = qualname
            raise
        self.stack.pop()
        return out


@contextlib.contextmanager
def _in_place_proxies() -> Iterator[None]:
    """torch.fx's Proxy has no `__iadd__`, so Python runs `y += 1` as `y = y + 1` while tracing: the graph then
    misses that a tensor `+=` writes into y's storage (an alias made before, `identity = y`, sees the change).
    While tracing, the in-place operators are recorded as what they are (operator.iadd, ...)."""
    added = []
    for fn in IN_PLACE_OPERATORS:
        name = f"__{fn.__name__}__"
        if name not in vars(fx.Proxy):
            setattr(fx.Proxy, name, lambda self, other, fn=fn: self.tracer.create_proxy(
                "call_function", fn, (self, other), {}))
            added.append(name)
    try:
        yield
    finally:
        for name in added:
            delattr(fx.Proxy, name)


def _attribute_ids(model: nn.Module) -> dict[tuple[str, ...], int]:
    """Every module attribute, parameter, buffer and child by identity: a forward that assigns one shows here
    (the tracer's own `_tensor_constant<i>`, tensors it made while tracing, are not the forward's)."""
    ids: dict[tuple[str, ...], int] = {}
    for path, m in model.named_modules():
        for k, v in vars(m).items():
            if k.startswith("_tensor_constant") or k in ("_forward_hooks", "_forward_pre_hooks", "training"):
                continue
            ids[(path, k)] = id(v)
            if k in ("_parameters", "_buffers", "_modules"):
                ids.update({(path, k, name): id(item) for name, item in v.items()})
    return ids


def trace(model: nn.Module) -> fx.GraphModule:
    """A GraphModule of `model` (which tracing may change: pass a copy). Submodules whose forward cannot be
    traced are kept whole; a root forward that cannot be is Untraceable."""
    leaves: frozenset[str] = frozenset()
    before = _attribute_ids(model)
    for _ in range(MAX_LEAVES + 1):
        tracer = _Tracer(leaves)
        try:
            with _in_place_proxies():
                graph = tracer.trace(model)
        except Exception as err:  # noqa: BLE001 - data-dependent control flow, unsupported Python, ...
            culprit = tracer.failed_in
            if not culprit or culprit in leaves:
                raise Untraceable(f"Model.forward cannot be traced by torch.fx ({one_line(err)})") from None
            leaves = leaves | {culprit}
            continue
        if _attribute_ids(model) != before:
            raise Untraceable("Model.forward assigns module attributes (state carried between calls)")
        gm = fx.GraphModule(model, graph)
        gm.meta["leaves"] = sorted(leaves)
        return gm
    raise Untraceable(f"more than {MAX_LEAVES} submodules cannot be traced by torch.fx")


# ---- in-place writes ---------------------------------------------------------------------------
# Ops whose result shares storage with their (first) input: an in-place write through one changes the other.
VIEW_METHODS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze", "transpose",
    "permute", "t", "expand", "expand_as", "narrow", "select", "unfold", "split", "chunk", "unbind", "as_strided",
    "detach", "contiguous", "diagonal", "movedim", "swapaxes", "swapdims", "view_as_real", "view_as_complex",
    "__getitem__", "split_with_sizes", "tensor_split"})
VIEW_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})
IN_PLACE_OPERATORS = {
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
    operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
    operator.ipow: operator.pow, operator.imatmul: operator.matmul, operator.iand: operator.and_,
    operator.ior: operator.or_, operator.ixor: operator.xor, operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
}


def _fn_name(node: fx.Node) -> str:
    return getattr(node.target, "__name__", "") if node.op == "call_function" else str(node.target)


def is_view(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in VIEW_METHODS
    if node.op == "call_function":
        if node.target is getattr:
            return len(node.args) > 1 and node.args[1] in VIEW_ATTRS
        return node.target is operator.getitem or _fn_name(node) in VIEW_METHODS
    return False


def in_place_target(node: fx.Node, gm: fx.GraphModule) -> fx.Node | None:
    """The node whose tensor `node` writes into, or None. setitem is reported too (its result is None)."""
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    if first is None:
        return None
    if node.op == "call_method":
        name = str(node.target)
        return first if name.endswith("_") and not name.startswith("_") else None
    if node.op == "call_function":
        if node.target in IN_PLACE_OPERATORS or node.target is operator.setitem:
            return first
        name = _fn_name(node)
        if node.kwargs.get("inplace") is True or (name.endswith("_") and not name.startswith("_")):
            return first
        return None
    if node.op == "call_module":
        return first if getattr(gm.get_submodule(str(node.target)), "inplace", False) is True else None
    return None


def _alias_groups(gm: fx.GraphModule) -> dict[fx.Node, int]:
    """Each node's storage group: nodes joined by view edges and in-place results share one."""
    parent: dict[fx.Node, fx.Node] = {}

    def find(n: fx.Node) -> fx.Node:
        while parent.get(n, n) is not n:
            n = parent[n]
        return n

    for node in gm.graph.nodes:
        if (is_view(node) or in_place_target(node, gm) is not None) and node.args and isinstance(node.args[0], fx.Node):
            parent[find(node)] = find(node.args[0])  # x.relu_() returns x itself
    return {n: id(find(n)) for n in gm.graph.nodes}


def _out_of_place(node: fx.Node) -> None:
    """Turn an in-place call into its out-of-place twin where one exists with the same arguments."""
    if node.op == "call_method" and hasattr(torch.Tensor, str(node.target)[:-1]) and node.target not in (
            "copy_", "fill_", "zero_", "set_", "resize_", "requires_grad_", "share_memory_"):
        node.target = str(node.target)[:-1]
    elif node.op == "call_function" and node.target in IN_PLACE_OPERATORS:
        node.target = IN_PLACE_OPERATORS[node.target]
    elif node.op == "call_function" and node.kwargs.get("inplace") is True:
        node.kwargs = {**node.kwargs, "inplace": False}
    elif node.op == "call_function" and _fn_name(node).endswith("_") and hasattr(torch, _fn_name(node)[:-1]):
        node.target = getattr(torch, _fn_name(node)[:-1])


def functionalize(gm: fx.GraphModule) -> set[fx.Node]:
    """Rewire reads after each in-place write to read the write's result, and make writes into the model's own
    intermediate tensors out of place (so they can fuse). Returns the writes kept as they are: those into an
    input, whose caller sees the change. Untraceable where a write reaches a parameter or buffer, or storage that
    another view still reads afterwards."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    groups = _alias_groups(gm)
    kept: set[fx.Node] = set()
    for node in nodes:
        target = in_place_target(node, gm)
        if target is None:
            continue
        group = [n for n in nodes if groups[n] == groups[target]]
        if node.op == "call_function" and node.target is operator.setitem:
            raise Untraceable("Model.forward assigns into a tensor's elements (x[...] = v)")
        if any(n.op == "get_attr" for n in group):
            raise Untraceable("Model.forward writes in place into a parameter or buffer")
        # storage the write reaches through another name, read after it (names made after it read the result)
        later = [u for n in group if n is not target and order[n] < order[node] for u in n.users
                 if order[u] > order[node]]
        if later:
            raise Untraceable(f"an in-place write ({node.name}) changes a view that is read afterwards")
        for user in [u for u in target.users if order[u] > order[node]]:
            user.replace_input_with(target, node)
        if any(n.op == "placeholder" for n in group):
            kept.add(node)  # the caller's tensor: the write must happen
        else:
            _out_of_place(node)
    gm.graph.lint()
    return kept
