"""Device memory for verification: what one draw needs, and how the float64 evaluation is made to fit.

The contract runs each draw three or four times (strict eager, torch's default flags, float64, the candidate).
At KernelBench's full sizes one tensor can be 6-16 GB (level1/19_ReLU: 6.4 GB in, 6.4 GB out), so copies
that are harmless at small sizes do not fit an 80 GB GPU. The rules (pure functions of byte counts, shapes and
the module tree; `device_free` and `meta_estimate` are the two that look at a device or a problem):

- the eager model must fit: parameters + inputs + outputs (a meta-device run gives the shapes) is a lower
  bound checked before anything is drawn; a model above it gets one clear line, not an OOM traceback;
- the float64 evaluation needs about `8 / itemsize` times what eager needed (model, inputs, the forward's
  measured peak): on the device whole where that fits, else in slices of the batch, else on the CPU;
- slices of the batch only where they cannot change the answer, conservatively: the problem names its batch,
  the inputs whose dim 0 is the batch are sliced (others passed whole), every output leads with the batch,
  the forward updates no buffer, no module mixes rows or draws random numbers (`row_mixing_modules`), and
  eager run on the last slice alone gives eager's rows of the whole batch (`slicing_blocked` and its caller);
- finished reference outputs stay on the device only while they are small next to its free memory and leave
  room for the next run; others wait in host memory and are compared chunk by chunk (`paired_chunks`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from kfuse.load import Problem

GB = 1e9
# Fraction of free memory a plan may fill: the caching allocator's rounding and cuDNN/cuBLAS workspaces
# (which the measured peak of another dtype does not show) take the rest.
SAFETY = 0.85
# Reference results kept on the device may take at most this share of its free memory: the judge holds one
# draw's results per trial before its candidate runs, in another process.
RESIDENT_SHARE = 0.125
MAX_SLICE_DOUBLINGS = 6  # an OOM in a sliced run doubles the slice count, this many times, then the CPU
CHUNK_ELEMENTS = 1 << 24  # comparison chunks: 128 MB per float64 temporary


@dataclass(frozen=True)
class DrawBytes:
    """Bytes one forward call needs on its device."""

    model: int  # parameters and buffers
    inputs: int
    outputs: int
    transient: int  # the forward's peak above model + inputs (outputs included)

    @property
    def total(self) -> int:
        return self.model + self.inputs + max(self.outputs, self.transient)

    def widened(self, factor: float) -> "DrawBytes":
        """The same call with every floating tensor `factor` times wider (float64: 8 / itemsize); integer
        tensors are counted as widened too, which only overestimates."""
        return DrawBytes(*(math.ceil(v * factor) for v in (self.model, self.inputs, self.outputs, self.transient)))


@dataclass(frozen=True)
class Float64Plan:
    """Where the float64 evaluation runs: on the device (`slices` pieces of the batch) or on the CPU."""

    on_device: bool
    slices: int = 1


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors among `tensors` (a number an input list holds counts nothing)."""
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def module_bytes(module: nn.Module) -> int:
    return tensor_bytes(module.parameters()) + tensor_bytes(module.buffers())


def gb(nbytes: float) -> str:
    return f"{nbytes / GB:.1f}"


def float64_factor(dtype: torch.dtype) -> float:
    return 8 / torch.empty((), dtype=dtype).element_size()


def plan_float64(need: DrawBytes, free: int | None, batch: int | None) -> tuple[Float64Plan, ...]:
    """The attempts, in order, for a float64 evaluation needing `need` (already widened) with `free` bytes free
    on the device (None: it runs where eager ran, the CPU) and `batch` rows that may be sliced (None: the
    model's rows are not independent). Each later attempt is for an out-of-memory error in the one before
    (eager's measured peak only estimates float64's); the CPU is the last."""
    if free is None:
        return (Float64Plan(True),)
    budget = SAFETY * free
    whole = need.total <= budget
    attempts = [Float64Plan(True)] if whole else []
    slices = 2 if whole else slices_needed(need, budget, batch)
    if batch is not None and slices is not None:
        for _ in range(MAX_SLICE_DOUBLINGS + 1):
            attempts.append(Float64Plan(True, min(slices, batch)))
            if slices >= batch:
                break
            slices *= 2
    return (*attempts, Float64Plan(False))


def slices_needed(need: DrawBytes, budget: float, batch: int | None) -> int | None:
    """How many pieces of the batch make one piece's inputs and activations fit beside the model, or None."""
    if batch is None or batch < 2:
        return None
    per_row = (need.inputs + max(need.outputs, need.transient)) / batch  # inputs not sliced count as sliced
    rows = math.floor((budget - need.model) / per_row) if per_row > 0 else batch
    if rows < 1:
        return None
    return max(2, math.ceil(batch / rows))


def slice_bounds(batch: int, slices: int) -> list[tuple[int, int]]:
    """`slices` contiguous row ranges covering 0..batch, sizes differing by at most one."""
    slices = max(1, min(slices, batch))
    edges = [batch * i // slices for i in range(slices + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def batch_rows(shapes: Sequence[torch.Size], batch: int) -> tuple[bool, ...]:
    """Which inputs are sliced along with the batch: those whose dim 0 is the batch size."""
    return tuple(len(s) > 0 and s[0] == batch for s in shapes)


def row_mixing_modules(model: nn.Module) -> list[str]:
    """Submodules that make one row's output depend on other rows or on the random stream, as far as the
    module tree shows: BatchNorm on batch statistics, Dropout and RReLU in training mode, recurrent and
    attention layers (their dim 0 may be time or sequence). A forward can mix rows by itself too (x.mean(0),
    F.batch_norm): `slicing_blocked` adds checks on the results for that."""
    found = []
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and (m.training or m.running_mean is None):
            found.append(name or type(m).__name__)
        elif isinstance(m, (nn.modules.dropout._DropoutNd, nn.RReLU)) and m.training:
            found.append(name or type(m).__name__)
        elif isinstance(m, (nn.RNNBase, nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoderLayer,
                            nn.TransformerDecoderLayer)):
            found.append(name or type(m).__name__)
    return found


def slicing_blocked(model: nn.Module, input_shapes: Sequence[torch.Size], output_shapes: Sequence[torch.Size],
                    batch: int | None, buffers_changed: bool) -> str | None:
    """Why the float64 evaluation may not run in slices of the batch, or None where it may. Conservative:
    the problem names its batch, some input and every output lead with it, the forward leaves the buffers
    alone (a slice would update them once per slice) and no module mixes rows. The caller also checks one
    slice (the last: a forward that runs along dim 0, such as a cumsum, gets the first one right) against
    eager's rows."""
    if batch is None or batch < 2:
        return "the problem names no batch size"
    if not any(batch_rows(input_shapes, batch)):
        return f"no input has {batch} rows"
    if not output_shapes or any(len(s) == 0 or s[0] != batch for s in output_shapes):
        return f"not every output has {batch} rows"
    if buffers_changed:
        return "the forward updates buffers"
    mixing = row_mixing_modules(model)
    return f"rows are not independent ({', '.join(mixing[:3])})" if mixing else None


def keep_on_device(nbytes: int, free: int | None, need_next: int) -> bool:
    """Whether reference results of `nbytes` (now on the device, `free` bytes left beside them) stay there:
    only where they are a small share of the memory and the next run (`need_next` bytes) still fits."""
    if free is None:
        return True
    return nbytes <= RESIDENT_SHARE * (free + nbytes) and need_next <= SAFETY * free


def eager_too_big(path: object, need: int, free: int) -> str | None:
    """The one-line error for an eager model whose parameters, inputs and outputs alone exceed free memory."""
    if need <= free:
        return None
    return f"{path}: the eager model needs ~{gb(need)} GB, the GPU has {gb(free)} GB free"


def paired_chunks(tensors: Sequence[torch.Tensor],
                  elements: int = CHUNK_ELEMENTS) -> Iterator[tuple[torch.Tensor, ...]]:
    """The same pieces of same-shaped tensors, about `elements` elements each, as views: flat ranges where all
    are contiguous, else ranges of rows. A comparison then holds one piece of each at a time (on the device
    that compares them), never whole-size copies."""
    first = tensors[0]
    if first.dim() == 0 or first.numel() <= elements:
        yield tuple(tensors)
    elif all(t.is_contiguous() for t in tensors):
        flats = [t.view(-1) for t in tensors]
        for a in range(0, first.numel(), elements):
            yield tuple(f[a:a + elements] for f in flats)
    else:
        step = max(1, elements // max(1, first[0].numel()))
        for a in range(0, first.shape[0], step):
            yield tuple(t[a:a + step] for t in tensors)


def device_free(device: str | torch.device) -> int | None:
    """Free bytes on a CUDA device, the caching allocator's idle blocks released first; None for the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


def meta_estimate(problem: Problem, dtype: torch.dtype) -> DrawBytes:
    """Parameters, inputs and outputs of one eager call in `dtype`, from shapes alone (the meta device: no
    memory, no random init). A lower bound: intermediates are not counted, and where the forward cannot run
    on meta (it reads values) the outputs count as zero."""
    try:
        model = problem.build(device="meta").to(dtype)
        inputs = [t.to(dtype) if t.is_floating_point() else t for t in problem.inputs(device="meta")]
    except Exception:  # noqa: BLE001 - no estimate; the real run will say what is wrong
        return DrawBytes(0, 0, 0, 0)
    try:
        with torch.no_grad():
            outputs = _tensors(model(*inputs))
    except Exception:  # noqa: BLE001 - a forward that needs values: count what is known
        outputs = []
    return DrawBytes(module_bytes(model), tensor_bytes(inputs), tensor_bytes(outputs), tensor_bytes(outputs))


def _tensors(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _tensors(o)]
    return []
