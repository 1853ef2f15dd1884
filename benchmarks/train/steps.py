"""What the scripts beside this one share: a problem's eager model and its generated ModelNew with the same
state, the inputs, the bench's fixed upstream gradients, and each model's training step as `kfuse bench --train`
times it (grads to None, forward, backward; kfuse.bench.step_fn)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kfuse.bench import load_kfuse, step_fn, upstream_grads
from kfuse.load import load_problem


@dataclass(frozen=True)
class Steps:
    name: str
    module: ModuleType  # the generated ModelNew file, imported
    eager: torch.nn.Module
    fused: torch.nn.Module  # ModelNew, eager's state loaded
    inputs: list[torch.Tensor]
    eager_step: Callable[[], Any]
    fused_step: Callable[[], Any]

    def warm_fused(self, steps: int = 3) -> Callable[[], Any]:
        """ModelNew's step after `steps` untimed calls (compilation, autotuning, caches) and a sync."""
        for _ in range(steps):
            self.fused_step()
        torch.cuda.synchronize()
        return self.fused_step


def training_steps(path: str, device: str = "cuda") -> Steps:
    """Optimize the problem at `path` (kfuse's own pipeline, into a temporary folder) and build both models."""
    prob = load_problem(Path(path))
    module = load_kfuse(prob, device, Path(tempfile.mkdtemp()))
    torch.manual_seed(0)
    eager = prob.build(device=device)
    fused = prob.build(cls=module.ModelNew, device=device)
    fused.load_state_dict(eager.state_dict())
    inputs = prob.inputs(device=device)
    ups = upstream_grads(eager, inputs)
    return Steps(prob.name, module, eager, fused, inputs, step_fn(eager, inputs, ups), step_fn(fused, inputs, ups))
