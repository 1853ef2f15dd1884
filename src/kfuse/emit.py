"""Stage 6, emit: the standalone ModelNew file.

Layout of the file, top to bottom:
  1. a header: the source problem, the regions and what stayed a torch call, the GEMM scheme, and (once verified)
     the verification summary and the GEMM tile configs the verification ran;
  2. imports: what the file uses (standard library, torch, triton and, without a GPU, Triton's interpreter
     switched on; Gluon where a Hopper twin is generated);
  3. the original problem, unchanged (Model, constants, get_inputs, get_init_inputs);
  4. the fused regions: one kernel (and its Hopper twin) and one launcher per region, and its autograd spec
     (kfuse/backward.py), then `class ModelNew(Model)`: same constructor, same parameters and buffers, a fused
     forward that also trains;
  5. after a banner, kfuse's library: the definitions of kfuse/kernels/ the code above calls (kfuse/library.py).
Subclassing Model is what makes the state_dict round trip and same-seed construction exact. A model with nothing
fused gets a short file: no Triton, no library.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Sequence

import kfuse
from kfuse.backward import with_autograd
from kfuse.ir import Graph
from kfuse.library import Library, free_names, library
from kfuse.modes import Variant, guards
from kfuse.regions import generate
from kfuse.regions.common import RegionCode, kernel_name

SCHEME_NOTES = {
    "fp16x3p": "fp16 hi/lo split of both operands, three tensor-core products per K block, fp32 accumulate",
    "tf32x3": "Triton's three-pass TF32 products",
    "ieee": "plain fp32 FMA, as Triton's interpreter runs on the CPU",
}
# Definitions the generated regions use when they are defined (a decorator), not when they run: they go with the
# imports, ahead of the regions, rather than in the library after them.
EARLY = ("sm90_jit",)
# Library names kfuse reads from the generated module itself: the tile configs verification ran (the report's
# gemm_configs, the header's summary).
REPORTED = ("chosen_configs",)
LIBRARY_BANNER = ("# " + "=" * 118 + "\n"
                  "# kfuse's library: the definitions of kfuse/kernels/ that the code above calls, copied unchanged.\n"
                  "# " + "=" * 118)


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
        lines += forward_method("fused_forward", v.graph, codes, params, bool(v.unfused))
        return "\n".join(lines).rstrip("\n") + "\n"
    flags = " or ".join(guards(next(v for v, _ in forwards if v.mode == "train").graph))
    eval_forward = next(v for v, _ in forwards if v.mode == "eval")
    lines = [f"    def forward(self, {args}):",
             f"        if {flags}:  # Dropout in training mode: torch draws its mask, the forward keeps it a "
             "torch call",
             f"            {_call('forward_train', params, False)}",
             f"        {_call('forward_eval', params, fully_fused(eval_forward))}", ""]
    for v, codes in forwards:
        lines += forward_method(f"forward_{v.mode}", v.graph, codes, params, bool(v.unfused))
    return "\n".join(lines).rstrip("\n") + "\n"


def fully_fused(v: Variant) -> bool:
    return any(r.fused for r in v.regions) and not v.unfused


# The words a region adds to its stem for the names it defines (`<stem>_kernel`, `<stem>_apply_kernel`, ...).
DERIVED = ("kernel", "epilogue", "tiles", "apply", "finalize", "stats", "eval", "folded", "dz")


def claim_stem(stem: str, claimed: set[str]) -> str:
    """A region's name stem, unique in the file: two regions with the same ops (two Linear -> ReLU layers, or one
    region in both forwards) get `<stem>`, `<stem>_2`, ... Every name a region defines is its stem and one of the
    DERIVED words, so a stem also clashes with one that extends it by such a word (`linear` and `linear_apply`);
    the numbers claim_stem adds are no such word, so the search ends."""
    def extends(longer: str, shorter: str) -> bool:
        return longer.startswith(shorter + "_") and longer[len(shorter) + 1:].split("_")[0] in DERIVED

    def clashes(s: str) -> bool:
        return any(s == c or extends(s, c) or extends(c, s) for c in claimed)

    out, i = stem, 2
    while clashes(out):
        out, i = f"{stem}_{i}", i + 1
    claimed.add(out)
    return out


def region_codes(v: Variant, stems: set[str], classes: set[str]) -> list[RegionCode]:
    """Each region's code with its autograd Function, names claimed before any text is made."""
    codes = []
    for r in v.regions:
        stem = claim_stem(kernel_name(r), stems) if r.fused else ""
        codes.append(with_autograd(r, v.graph, generate(r, v.graph, stem), stem, classes))
    return codes


IMPORTS = "import torch"
CALL_MODULES = ("builtins", "math", "operator")  # torch calls kept as written may name these (`operator.floordiv`)
TRITON_IMPORTS = ("if not torch.cuda.is_available():\n"
                  "    os.environ.setdefault(\"TRITON_INTERPRET\", \"1\")"
                  "  # no GPU: Triton's interpreter runs the kernels\n"
                  "import triton  # noqa: E402\nimport triton.language as tl  # noqa: E402")


def call_imports(forward_lines: Sequence[str]) -> list[str]:
    """`import m` for each module the torch calls kept as written name (`operator.floordiv`)."""
    return [f"import {m}" for m in CALL_MODULES if any(re.search(rf"\b{m}\.", ln) for ln in forward_lines)]


def _imports(forward_lines: Sequence[str], strict: bool, lib: Library | None) -> str:
    """The file's imports: what the kept torch calls name, contextlib for strict_fp32, what the library reads,
    torch, and Triton where anything is fused."""
    used = call_imports(forward_lines)
    if strict:
        used.append("import contextlib")
    if lib is not None:
        used += [*lib.imports, "import os"]
    text = "\n".join(sorted(set(used), key=lambda ln: (ln.startswith("from"), ln)))
    text = (text + "\n\n" if text else "") + IMPORTS
    if lib is not None:
        text += "\n\n" + TRITON_IMPORTS + ("\n\n\n" + "\n\n\n".join(lib.early) if lib.early else "")
    return text


def generated_line(problem_name: str) -> str:
    """The file's first line: how kfuse (and its file-safety check) recognises a file it wrote."""
    return (f"# Generated by kfuse {kfuse.__version__} from {problem_name}. "
            "Regenerate with `kfuse optimize`; do not edit.")


def _header(problem_name: str, variants: Sequence[Variant], fused: bool, scheme: str,
            verified: Sequence[str]) -> list[str]:
    header = [generated_line(problem_name)]
    if not fused:
        header.append("# Nothing here is fused: ModelNew runs the original ops as torch calls.")
    else:
        header.append("# ModelNew is the original Model with a forward built from fused Triton kernels:")
    for v in variants:
        if v.mode != "any":
            dropout = "in training mode" if v.mode == "train" else "in eval mode: the identity"
            header.append(f"# forward_{v.mode} (Dropout {dropout}):")
        header += [f"#   {r.kind}: {' -> '.join(n.origin for n in r.nodes)}" for r in v.regions if r.fused]
        header.append(f"#   Left as torch calls: {', '.join(v.unfused) if v.unfused else 'none'}.")
        if v.rewrites:
            header.append(f"#   Exact rewrites applied: {', '.join(v.rewrites)}.")
    if fused:
        header.append(f"# GEMM scheme: {scheme} ({SCHEME_NOTES.get(scheme, scheme)}).")
        header.append("# Training: each fused region is a torch.autograd.Function (used only when a gradient is "
                      "needed).")
    header += [f"# {ln}" for ln in verified]
    return [wrapped for ln in header for wrapped in textwrap.wrap(ln, 118, subsequent_indent="#     ")]


def _regions_part(forwards: Sequence[tuple[Variant, list[RegionCode]]]) -> list[str]:
    parts = []
    for _, codes in forwards:
        for code in codes:
            parts += [k.rstrip("\n") for k in code.kernels]
            if code.launcher:
                parts.append(code.launcher.rstrip("\n"))
    return parts


def emit(problem_source: str, problem_name: str, variants: Sequence[Variant], scheme: str,
         verified: Sequence[str] = ()) -> str:
    """The ModelNew file. `verified`: header lines summarising the verification (none before it ran)."""
    stems: set[str] = set()
    classes: set[str] = set()
    forwards = [(v, region_codes(v, stems, classes)) for v in variants]
    fused = any(r.fused for v in variants for r in v.regions)
    strict = any(v.unfused for v in variants)
    future, original = _split_future(problem_source)
    params = list(variants[0].graph.inputs)
    doc = "Model with a fused forward" if fused else "Model with its ops as torch calls"
    model_new = ("class ModelNew(Model):\n"
                 f'    """{doc}: same constructor, parameters and buffers."""\n\n'
                 + forward_source(forwards, params).rstrip("\n"))
    regions = _regions_part(forwards)
    lib = None
    if fused:
        roots = free_names("\n\n".join([*regions, model_new])) | set(REPORTED)
        lib = library(roots, exclude=("GEMM_SCHEME",), early=EARLY)
    parts = [
        "\n".join([*future, *_header(problem_name, variants, fused, scheme, verified)]),
        _imports([ln for _, codes in forwards for c in codes for ln in c.forward], strict, lib),
        "# ---------------- the original problem, unchanged ----------------\n" + original.strip("\n"),
    ]
    if strict:
        parts.append(STRICT_FP32)
    if fused:
        parts.append("# ---------------- fused regions, generated for this problem ----------------\n"
                     f'GEMM_SCHEME = "{scheme}"  # the GEMM scheme every region runs (kfuse optimize --scheme)')
    parts += [*regions, model_new]
    if lib is not None:
        parts += [LIBRARY_BANNER, *lib.sections]
    return "\n\n\n".join(parts) + "\n"


def emit_original(problem_source: str, problem_name: str, reason: str) -> str:
    """The ModelNew of a model kfuse cannot capture: Model itself, its forward unchanged, and why."""
    future, original = _split_future(problem_source)
    header = [*future,
              generated_line(problem_name),
              "# Nothing here is fused: ModelNew runs Model.forward unchanged, because",
              f"#   {reason}"]
    return "\n\n\n".join([
        "\n".join(header), _imports([], True, None),
        "# ---------------- the original problem, unchanged ----------------\n" + original.strip("\n"),
        STRICT_FP32,
        "class ModelNew(Model):\n"
        '    """Model itself (kfuse runs its forward unchanged): same constructor, parameters and buffers."""\n\n'
        "    def forward(self, *args, **kwargs):\n"
        "        with strict_fp32():\n"
        "            return super().forward(*args, **kwargs)",
    ]) + "\n"


def model_forward_params(model_cls: type) -> list[str]:
    sig = inspect.signature(model_cls.forward)
    return [p for p in sig.parameters if p != "self"]
