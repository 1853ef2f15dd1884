"""Stage 6, emit: the standalone ModelNew file.

Layout of the file, top to bottom:
  1. a header naming the source problem, the regions and what stayed a torch call;
  2. imports (torch, triton, standard library) and, without a GPU, Triton's interpreter switched on;
  3. the original problem, unchanged (Model, constants, get_inputs, get_init_inputs);
  4. the GEMM core and run-time helpers (copied from kfuse/kernels/ with only what they use);
  5. one kernel and one launcher per fused region, and its torch.autograd.Function (kfuse/backward.py), with
     the training helpers and the backward GEMM kernel (kfuse/kernels/backward.py) before them;
  6. `class ModelNew(Model)`: same constructor, same parameters and buffers, a fused forward that also trains.
Subclassing Model is what makes the state_dict round trip and same-seed construction exact.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
from collections.abc import Sequence
from pathlib import Path

import kfuse
from kfuse.backward import with_autograd
from kfuse.ir import Graph
from kfuse.modes import Variant, guards
from kfuse.partition import Region
from kfuse.regions import generate
from kfuse.regions.common import RegionCode

KERNELS = Path(__file__).parent / "kernels"
CORE_ROOTS = ("SPLIT_SCHEMES", "SKINNY_M", "cdiv", "gemm_tile", "_tile_ids", "GemmConfig", "default_config", "valid_configs", "split_weight",
              "split_x", "row_scales", "padded_k", "ensure_tma_allocator", "sm90_configs",
              "sm90_maxnreg", "_num_sms")
MARKER = "# --- emitted below ---"


def _top_level(tree: ast.Module) -> dict[str, ast.stmt]:
    defs: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            defs[stmt.name] = stmt
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    defs[t.id] = stmt
    return defs


def module_closure(path: Path, roots: Sequence[str]) -> str:
    """The top-level definitions of `path` that `roots` need, transitively, in file order, with decorators."""
    source = path.read_text()
    tree = ast.parse(source)
    defs = _top_level(tree)
    need: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in need or name not in defs:
            continue
        need.add(name)
        todo += [n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)]
    lines = source.splitlines()
    chunks = []
    for stmt in tree.body:
        if any(defs.get(n) is stmt for n in need):
            start = min([d.lineno for d in getattr(stmt, "decorator_list", [])] + [stmt.lineno])
            chunks.append("\n".join(lines[start - 1:stmt.end_lineno]))
    return "\n\n\n".join(dict.fromkeys(chunks)) + "\n"


def emitted_part(module: str) -> str:
    """The part of kernels/<module>.py below its marker line: what a generated file carries verbatim."""
    text = (KERNELS / f"{module}.py").read_text()
    return text.split(MARKER, 1)[1].strip("\n")


# Fixed kernels a region kind needs beside its generated ones (kernels/<module>.py, below the marker).
KIND_MODULES = {"gemm_batchnorm": "batchnorm"}


def _split_future(source: str) -> tuple[list[str], str]:
    """`from __future__` imports must open a file: hoist them out of the embedded problem."""
    future = [ln for ln in source.splitlines() if ln.startswith("from __future__")]
    rest = "\n".join(ln for ln in source.splitlines() if not ln.startswith("from __future__"))
    return future, rest


STRICT_FP32 = '''@contextlib.contextmanager
def strict_fp32():
    """Torch calls kept as written run in fp32, as the accuracy contract's eager reference does: cuDNN's
    convolutions (and matmuls, where a user turned it on) would otherwise run in TF32, 1e-3 away from float64."""
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags'''


def forward_method(name: str, g: Graph, codes: Sequence[RegionCode], params: Sequence[str],
                   strict: bool = False) -> list[str]:
    """The method `name` running the regions' forward lines; `strict`: inside strict_fp32 (torch calls left)."""
    body = [ln for code in codes for ln in code.forward]
    outs = ", ".join(g.outputs)
    if g.output_structure == "single":
        ret = g.outputs[0]
    elif g.output_structure == "list":
        ret = f"[{outs}]"
    elif g.output_structure == "tuple":
        ret = f"({outs},)" if len(g.outputs) == 1 else f"({outs})"
    else:
        ret = g.output_structure
    lines = [*body, f"return {ret}"]
    if strict:
        lines = ["with strict_fp32():", *[f"    {ln}" for ln in lines]]
    return [f"    def {name}(self, {', '.join(params)}):"] + [f"        {ln}" for ln in lines] + [""]


def _call(method: str, params: Sequence[str], graphed: bool) -> str:
    """`graphed` (every op fused): replay_forward replays the method as a CUDA graph for repeated inference
    calls (kfuse/kernels/graphs.py)."""
    args = ", ".join(params)
    if graphed:
        return f"return replay_forward(self, self.{method}{', ' if args else ''}{args})"
    return f"return self.{method}({args})"


def forward_source(forwards: Sequence[tuple[Variant, list[RegionCode]]], params: Sequence[str]) -> str:
    """ModelNew's forward. One variant: its body is `forward`, or `fused_forward` handed to replay_forward when
    every op is fused. Two (modes.py): forward runs `forward_train` while a guard is set, else `forward_eval`."""
    args = ", ".join(params)
    if len(forwards) == 1:
        (v, codes), = forwards
        if not fully_fused(v):
            return "\n".join(forward_method("forward", v.graph, codes, params, bool(v.unfused))).rstrip("\n") + "\n"
        lines = [f"    def forward(self, {args}):", f"        {_call('fused_forward', params, True)}", ""]
        return "\n".join(lines + forward_method("fused_forward", v.graph, codes, params, bool(v.unfused))).rstrip("\n") + "\n"
    flags = " or ".join(guards(next(v for v, _ in forwards if v.mode == "train").graph))
    lines = [f"    def forward(self, {args}):",
             f"        if {flags}:  # Dropout in training mode: torch draws its mask, the forward keeps it a torch call",
             f"            {_call('forward_train', params, False)}",
             f"        {_call('forward_eval', params, fully_fused(next(v for v, _ in forwards if v.mode == 'eval')))}", ""]
    for v, codes in forwards:
        lines += forward_method(f"forward_{v.mode}", v.graph, codes, params, bool(v.unfused))
    return "\n".join(lines).rstrip("\n") + "\n"


def fully_fused(v: Variant) -> bool:
    return any(r.fused for r in v.regions) and not v.unfused


_DEF = re.compile(r"^def (\w+)\(", re.M)


def unique_names(code: RegionCode, defined: set[str]) -> RegionCode:
    """Kernel and launcher names come from a region's ops, so two regions with the same ops (two Linear ->
    ReLU layers, or one region in both forwards) would define a name twice and the later one would shadow the
    earlier: a clashing name gets a suffix throughout the region's code."""
    texts = (*code.kernels, code.launcher)
    for name in [m for t in texts for m in _DEF.findall(t)]:
        if name in defined:
            i = 2
            while f"{name}_{i}" in defined:
                i += 1
            sub = functools.partial(re.sub, rf"\b{name}\b", f"{name}_{i}")
            code = dataclasses.replace(code, kernels=tuple(map(sub, code.kernels)), launcher=sub(code.launcher),
                                       forward=tuple(map(sub, code.forward)), z_forward=tuple(map(sub, code.z_forward)))
            name = f"{name}_{i}"
        defined.add(name)
    return code


IMPORTS = ("import dataclasses\nimport os\nimport time\nimport weakref\nfrom collections import OrderedDict\n\n"
           "import torch")
CALL_MODULES = ("builtins", "math", "operator")  # torch calls kept as written may name these (`operator.floordiv`)


def _imports(forward_lines: Sequence[str], strict: bool) -> str:
    """The file's imports: what the kept torch calls name, contextlib for strict_fp32, and the fixed ones."""
    used = [m for m in CALL_MODULES if any(re.search(rf"\b{m}\.", ln) for ln in forward_lines)]
    return "".join(f"import {m}\n" for m in sorted([*used, *(["contextlib"] if strict else [])])) + IMPORTS
TRITON_IMPORTS = ("if not torch.cuda.is_available():\n"
                  "    os.environ.setdefault(\"TRITON_INTERPRET\", \"1\")  # no GPU: Triton's interpreter runs the kernels\n"
                  "import triton  # noqa: E402\nimport triton.language as tl  # noqa: E402")


def _header(problem_name: str, variants: Sequence[Variant], fused: bool) -> list[str]:
    header = [f"# Generated by kfuse {kfuse.__version__} from {problem_name}. Regenerate with `kfuse optimize`; do not edit."]
    if not fused:
        header.append("# Nothing here is fused: ModelNew runs the original ops as torch calls.")
    else:
        header.append("# ModelNew is the original Model with a forward built from fused Triton kernels:")
    for v in variants:
        if v.mode != "any":
            header.append(f"# forward_{v.mode} (Dropout {'in training mode' if v.mode == 'train' else 'in eval mode: the identity'}):")
        header += [f"#   {r.kind}: {' -> '.join(n.origin for n in r.nodes)}" for r in v.regions if r.fused]
        header.append(f"#   Left as torch calls: {', '.join(v.unfused) if v.unfused else 'none'}.")
        if v.rewrites:
            header.append(f"#   Exact rewrites applied: {', '.join(v.rewrites)}.")
    if fused:
        header.append("# Training: each fused region is a torch.autograd.Function (used only when a gradient is needed).")
    return header


def _library(regions: Sequence[Region], variants: Sequence[Variant], scheme: str) -> list[str]:
    """The kernels and helpers the fused regions call, copied from kfuse/kernels/."""
    runtime = emitted_part("runtime").replace('GEMM_SCHEME = "fp16x3p"', f'GEMM_SCHEME = "{scheme}"', 1)
    parts = [
        "# ---------------- fp32-accurate GEMM core (kfuse/kernels/gemm_core.py) ----------------\n"
        + module_closure(KERNELS / "gemm_core.py", CORE_ROOTS).rstrip("\n"),
        "# ---------------- the GEMM tile on Hopper, in Gluon (kfuse/kernels/gemm_sm90.py) ----------------\n"
        + emitted_part("gemm_sm90"),
        "# ---------------- skinny GEMMs: the float64 split-K pass (kfuse/kernels/skinny.py) ----------------\n"
        + emitted_part("skinny"),
        "# ---------------- run-time helpers (kfuse/kernels/runtime.py) ----------------\n" + runtime.rstrip("\n"),
    ]
    for module in dict.fromkeys(KIND_MODULES[r.kind] for r in regions if r.kind in KIND_MODULES):
        parts.append(f"# ---------------- kfuse/kernels/{module}.py ----------------\n" + emitted_part(module))
    parts.append("# ---------------- training: autograd bases, backward GEMM (kfuse/kernels/backward.py) "
                 "----------------\n" + emitted_part("backward"))
    parts.append("# ---------------- training: epilogue backward launcher (kfuse/kernels/backward_ops.py) "
                 "----------------\n" + emitted_part("backward_ops"))
    if any(fully_fused(v) for v in variants):
        parts.append("# ---------------- CUDA graphs for repeated inference calls (kfuse/kernels/graphs.py) "
                     "----------------\n" + emitted_part("graphs"))
    return parts


def emit(problem_source: str, problem_name: str, variants: Sequence[Variant], scheme: str) -> str:
    taken: set[str] = set()
    defined: set[str] = set()
    forwards = [(v, [unique_names(with_autograd(r, v.graph, generate(r, v.graph), taken), defined) for r in v.regions])
                for v in variants]
    regions = [r for v in variants for r in v.regions]
    fused = any(r.fused for r in regions)
    future, original = _split_future(problem_source)
    parts = [
        "\n".join([*future, *_header(problem_name, variants, fused)]),
        _imports([ln for _, codes in forwards for c in codes for ln in c.forward], any(v.unfused for v in variants)) + (
            "\n\n" + TRITON_IMPORTS if fused else ""),
        "# ---------------- the original problem, unchanged ----------------\n" + original.strip("\n"),
    ]
    if any(v.unfused for v in variants):
        parts.append(STRICT_FP32)
    if fused:
        parts += _library(regions, variants, scheme)
        parts.append("# ---------------- fused regions ----------------")
    for _, codes in forwards:
        for code in codes:
            parts += [k.rstrip("\n") for k in code.kernels]
            if code.launcher:
                parts.append(code.launcher.rstrip("\n"))
    params = list(variants[0].graph.inputs)
    doc = "Model with a fused forward" if fused else "Model with its ops as torch calls"
    parts.append("class ModelNew(Model):\n"
                 f'    """{doc}: same constructor, parameters and buffers."""\n\n'
                 + forward_source(forwards, params).rstrip("\n"))
    return "\n\n\n".join(parts) + "\n"


def emit_original(problem_source: str, problem_name: str, reason: str) -> str:
    """The ModelNew of a model kfuse cannot capture: Model itself, its forward unchanged, and why."""
    future, original = _split_future(problem_source)
    header = [*future,
              f"# Generated by kfuse {kfuse.__version__} from {problem_name}. Regenerate with `kfuse optimize`; do not edit.",
              "# Nothing here is fused: ModelNew runs Model.forward unchanged, because",
              f"#   {reason}"]
    return "\n\n\n".join([
        "\n".join(header), _imports([], True),
        "# ---------------- the original problem, unchanged ----------------\n" + original.strip("\n"),
        STRICT_FP32,
        "class ModelNew(Model):\n"
        f'    """Model itself (kfuse runs its forward unchanged): same constructor, parameters and buffers."""\n\n'
        "    def forward(self, *args, **kwargs):\n"
        "        with strict_fp32():\n"
        "            return super().forward(*args, **kwargs)",
    ]) + "\n"


def model_forward_params(model_cls: type) -> list[str]:
    sig = inspect.signature(model_cls.forward)
    return [p for p in sig.parameters if p != "self"]
