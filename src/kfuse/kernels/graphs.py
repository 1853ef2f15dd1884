"""CUDA graphs for repeated inference calls: a generated ModelNew replays its whole forward as one graph.

Why: a small problem (problems/gemm/33: 1000 x 1000 -> 999) needs ~25 us of GPU work but ~140 us of host time
to issue its Triton launches (JITFunction.run costs ~25-35 us per launch in Triton 3.6, plus the launcher glue:
benchmarks/overhead/NOTES.md). One graph replay issues all of them in a single call. torch.compile's
max-autotune mode does the same (cudagraphs), so this is the baseline's own method, not a shortcut.

When a graph stands in for the forward (`replay_forward`): CUDA inputs, no gradient needed (torch.no_grad or
inference_mode), a forward made only of kfuse's kernels (no torch fallback op: the emitter decides), and no
module in training mode whose behaviour depends on it (BatchNorm's running statistics, Dropout's random mask):
a replay must do exactly what the launches would, with nothing random and no state written outside it.

What a graph bakes in, and so what its key holds (`graph_key`): the inputs' addresses, shapes, strides and
dtypes; every parameter's, buffer's and tensor attribute's address, version counter (bumped by an optimizer
step, load_state_dict, any in-place write), shape and dtype; every module's mode and plain attributes (a scale
factor, an eps, a list of sizes: numbers, strings, and tuples or lists of them; other objects are not looked
into). A key is captured the second call in a row it is seen (the first call runs the launches: compiles,
tunes, fills the weight caches). The graph is kept only if its replays measure faster than the launches
(`replay_pays`: a GPU-bound forward keeps its launches); it is replayed from then on. The outputs are copied
out of the graph's memory, so a result the caller keeps is never overwritten by a later call. An entry keeps
the tensors of its key alive, so their addresses cannot be taken by other tensors while the key can match.
Writes through `param.data` bypass the version counter (as for the weight caches): call `forget_graphs(model)`
after one.

KFUSE_CUDA_GRAPHS=0 turns graphs off.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict

import torch

from kfuse.kernels.runtime import cuda_graphs_on, tensor_key

# --- emitted below ---
MAX_GRAPHS = 2  # per model, the most recently used keys: each graph holds its own copy of the intermediates
# modules whose forward depends on self.training: a graph may not replay them in training mode
MODE_DEPENDENT = (torch.nn.modules.batchnorm._NormBase, torch.nn.modules.dropout._DropoutNd, torch.nn.RReLU)
_SCALARS = (bool, int, float, str, type(None))
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> CudaGraphs (never pickled with it)


def _plain(v) -> bool:
    """A number, string, bool or None, or a tuple or list of them: what a forward may read as a setting."""
    return isinstance(v, _SCALARS) or (type(v) in (tuple, list) and all(isinstance(e, _SCALARS) for e in v))


def _setting(v):
    """A plain value as a key part (a list, which can change in place, as a tuple of its current items)."""
    return tuple(v) if type(v) is list else v


def _module_tensors(m: torch.nn.Module) -> list:
    """A module's own parameters, buffers and tensor attributes (None for an absent optional one)."""
    return [*m._parameters.values(), *m._buffers.values(),
            *(v for v in m.__dict__.values() if isinstance(v, torch.Tensor))]


def graph_key(model: torch.nn.Module, inputs: tuple) -> tuple | None:
    """Everything a captured forward of `model` on `inputs` depends on; None where no graph may replace it (an
    input that is neither a tensor nor a plain value, a mode-dependent module in training mode)."""
    modules = list(model.modules())
    if any(m.training and isinstance(m, MODE_DEPENDENT) for m in modules):
        return None  # before any key part: a training-mode BatchNorm forward (problem 39) pays nothing for the check
    key: list = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            key.append(tensor_key(x))
        elif _plain(x):
            key.append(_setting(x))
        else:
            return None
    for m in modules:
        key.append(id(m))
        key += [None if t is None else tensor_key(t) for t in _module_tensors(m)]
        key += [(name, _setting(v)) for name, v in m.__dict__.items() if _plain(v)]
    return tuple(key)


def _key_tensors(model: torch.nn.Module) -> tuple:
    """The tensors a key's addresses point at (kept alive with the graph: see the module docstring)."""
    return tuple(t for m in model.modules() for t in _module_tensors(m) if t is not None)


def _copy_out(outs):
    """The graph's outputs copied into fresh tensors: the next replay writes the graph's own."""
    if isinstance(outs, torch.Tensor):
        return outs.clone()
    if isinstance(outs, (tuple, list)):
        return type(outs)(_copy_out(o) for o in outs)
    return outs


class CudaGraphs:
    """One model's captured forwards by graph_key (None for a key whose capture failed), most recent last."""

    def __init__(self) -> None:
        self.graphs: OrderedDict = OrderedDict()
        self.last_key: tuple | None = None

    def call(self, model: torch.nn.Module, forward, inputs: tuple):
        key = graph_key(model, inputs)
        if key is None:
            return forward(*inputs)
        if key not in self.graphs:
            if key != self.last_key:  # first sight: run the launches (compiles, tunes, fills caches)
                self.last_key = key
                return forward(*inputs)
            entry = self.capture(model, forward, inputs)
            self.graphs[key] = entry if entry is not None and replay_pays(entry, forward, inputs) else None
            while len(self.graphs) > MAX_GRAPHS:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        entry = self.graphs[key]
        if entry is None:
            return forward(*inputs)
        return replay(entry)

    @staticmethod
    def capture(model: torch.nn.Module, forward, inputs: tuple):
        """(graph, its outputs, the key's tensors), or None where the forward cannot be captured (a host sync,
        a CPU tensor): that key then always runs the launches."""
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outs = forward(*inputs)
        except Exception:  # the launches then raise the real error, if there is one
            return None
        return graph, outs, _key_tensors(model)


def replay(entry: tuple):
    entry[0].replay()
    return _copy_out(entry[1])


def _wall_per_call(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


def replay_pays(entry: tuple, forward, inputs: tuple, calls: int = 5, rounds: int = 3) -> bool:
    """Whether a replay (plus the copy of its outputs) is measurably faster than the launches: calls queued back
    to back, wall time per call, so a host-bound forward shows its issue time and a GPU-bound one its GPU time;
    the best of `rounds` for each, so a stall on a busy host (compile workers, a GC pause) cannot decide it.
    A large GEMM is GPU-bound: its graph would save nothing and the copy would cost (32 MiB at 1024 x 8192)."""
    replay(entry), forward(*inputs)  # warm: the graph's first replay uploads it
    launches = min(_wall_per_call(lambda: forward(*inputs), calls) for _ in range(rounds))
    replays = min(_wall_per_call(lambda: replay(entry), calls) for _ in range(rounds))
    return replays < 0.9 * launches


def graphs_enabled() -> bool:
    return cuda_graphs_on()  # KFUSE_CUDA_GRAPHS, read once into runtime.SETTINGS


def replay_forward(model: torch.nn.Module, forward, *inputs):
    """ModelNew.forward: `forward(*inputs)` (the fused launches), or a replay of its CUDA graph where one may
    stand in for it (the module docstring says when)."""
    if torch.is_grad_enabled() or not graphs_enabled() or not all(
            t.is_cuda for t in inputs if isinstance(t, torch.Tensor)):
        return forward(*inputs)
    graphs = _GRAPHS.get(model)
    if graphs is None:
        graphs = _GRAPHS[model] = CudaGraphs()
    return graphs.call(model, forward, inputs)


def forget_graphs(model: torch.nn.Module) -> None:
    """Drop the model's captured graphs (after a write that bypasses version counters, e.g. `param.data[...] =`)."""
    _GRAPHS.pop(model, None)


def graph_kept(model: torch.nn.Module) -> bool:
    """Whether a CUDA graph stands in for the model's forward for some key (one replay_pays kept)."""
    graphs = _GRAPHS.get(model)
    return graphs is not None and any(entry is not None for entry in graphs.graphs.values())
