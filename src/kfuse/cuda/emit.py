"""The standalone ModelNew file of `--backend cuda`.

Layout, top to bottom:
  1. the header: the problem, the regions, each op left a torch call and why, the GEMM scheme, (once verified) the
     verification summary;
  2. imports: the standard library and torch only (no Triton);
  3. the original problem, unchanged;
  4. kfuse's CUDA runtime: the definitions of kfuse/cuda/runtime.py (build-once loading, operand caches, the
     autograd bases) and of kfuse/kernels/backward.py (BatchNorm's forward state) that the file's code reads,
     found by name (kfuse/library.py, CUDA_MODULES) and copied unchanged;
  5. CUDA_SRC and CPP_SRC (gemm_source.py's fixed kernels, then each region's epilogue struct and launcher) and
     `cuda_module()`, which compiles them on the first call on a machine;
  6. per fused region: its Python launcher `fused_<stem>` and its autograd Function `<Stem>Fn`; then
     `class ModelNew(Model)`, whose forward calls them and keeps every other op as the torch call it was.
A model with nothing this backend fuses gets the Triton backend's short file (nothing fused, so no Triton either).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from kfuse.cuda.epilogue import CudaRegion
from kfuse.cuda.glue import cpp_source, cuda_source
from kfuse.cuda.regions import cuda_kind, unfused_reasons
from kfuse.emit import STRICT_FP32, _split_future, call_imports, claim_stem, emit, forward_method, generated_line
from kfuse.library import CUDA_MODULES, Library, free_names, library
from kfuse.modes import Variant, guards
from kfuse.ops import CONV_OPS
from kfuse.regions import generate
from kfuse.regions.common import kernel_name
from kfuse.regions.conv_common import TRANSPOSED

SCHEME_NOTES = {
    "fp16x3p": "fp16 hi/lo split of both operands, the three products on tensor cores with each short chunk's "
               "partial added into an fp32 register accumulator: CUTLASS's TMA + wgmma kernel on an sm_90 GPU with "
               "CUTLASS's headers (pip install nvidia-cutlass), else a WMMA tile",
    "ieee": "fp32 operands on the CUDA cores, float64 products and sums rounded to fp32 once",
}
CONV_NOTE = ("x packed on every call into per-pixel fp16 hi/lo records (a per-sample power-of-two scale, each group's "
             "channels padded to 8), then an implicit-GEMM WMMA tile over the taps with fp16x3p's three products and "
             "promotion, whatever the GEMM scheme (a transposed convolution: one launch per stride phase, over only "
             "the taps that reach its pixels); the weight's split is cached by its version counter. Where a group "
             "has fewer than 8 input channels (depthwise convolutions among them), a direct tile instead: x as it is, "
             "exact products summed in double on the CUDA cores.")
CUDA_MODULE = '''def cuda_module():
    """The compiled extension of CUDA_SRC and CPP_SRC: built on the first call on this machine, then loaded from
    the cache folder (runtime.load_extension)."""
    return load_extension(CUDA_SRC, CPP_SRC, CUDA_FUNCTIONS)'''
# names the file defines itself: never taken from the runtime's modules
DEFINED_HERE = ("GEMM_SCHEME", "CUDA_SRC", "CPP_SRC", "CUDA_FUNCTIONS", "cuda_module")


def runtime_library(generated: Sequence[str]) -> Library:
    """The runtime definitions the generated Python (launchers, Functions, ModelNew, cuda_module) reads,
    transitively."""
    return library(free_names("\n\n".join(generated)), exclude=DEFINED_HERE, modules=CUDA_MODULES)


def _forward_lines(v: Variant, stems: set[str], classes: set[str]) -> tuple[list[str], list[CudaRegion]]:
    lines: list[str] = []
    fused: list[CudaRegion] = []
    for r in v.regions:
        if r.fused:
            code = cuda_kind(r.kind).cuda_code(r, v.graph, claim_stem(kernel_name(r), stems), classes)
            fused.append(code)
            lines += code.forward
        else:
            lines += generate(r, v.graph, "").forward
    return lines, fused


def model_new(forwards: Sequence[tuple[Variant, list[str]]], params: Sequence[str]) -> str:
    """`class ModelNew(Model)`: one forward, or (Dropout following the mode) forward_train / forward_eval."""
    head = ["class ModelNew(Model):", '    """Model with a forward on fused CUDA kernels: same constructor, parameters '
            'and buffers."""', ""]
    args = ", ".join(params)
    if len(forwards) == 1:
        (v, lines), = forwards
        body = forward_method("forward", v.graph, [_Lines(tuple(lines))], params, bool(v.unfused))
        return "\n".join(head + body).rstrip("\n") + "\n"
    flags = " or ".join(guards(next(v for v, _ in forwards if v.mode == "train").graph))
    body = [f"    def forward(self, {args}):",
            f"        if {flags}:  # Dropout in training mode: torch draws its mask",
            f"            return self.forward_train({args})",
            f"        return self.forward_eval({args})", ""]
    for v, lines in forwards:
        body += forward_method(f"forward_{v.mode}", v.graph, [_Lines(tuple(lines))], params, bool(v.unfused))
    return "\n".join(head + body).rstrip("\n") + "\n"


@dataclass(frozen=True)
class _Lines:
    """What kfuse.emit.forward_method reads of a region's code: its forward lines."""

    forward: tuple[str, ...]


def header(problem_name: str, variants: Sequence[Variant], scheme: str, verified: Sequence[str]) -> list[str]:
    lines = [generated_line(problem_name),
             "# ModelNew is the original Model with a forward built from fused CUDA C++ kernels (kfuse optimize "
             "--backend cuda), compiled once per machine by torch.utils.cpp_extension.load_inline (a CUDA GPU and "
             "nvcc needed):"]
    for v in variants:
        if v.mode != "any":
            lines.append(f"# forward_{v.mode} (Dropout {'in training mode' if v.mode == 'train' else 'in eval mode'}):")
        lines += [f"#   {r.kind}: {' -> '.join(n.origin for n in r.nodes)}" for r in v.regions if r.fused]
        reasons = unfused_reasons(v)
        left = "; ".join(f"{op} ({why})" for op, why in reasons.items()) or "none"
        lines.append(f"#   Left as torch calls: {left}.")
        if v.rewrites:
            lines.append(f"#   Exact rewrites applied: {', '.join(v.rewrites)}.")
    lines.append(f"# GEMM scheme: {scheme} ({SCHEME_NOTES.get(scheme, scheme)}); GEMMs of at most 16 rows: a GEMV "
                 "kernel (W read once, float64 sums on the CUDA cores).")
    if any(r.fused and r.anchor.op in (*CONV_OPS, TRANSPOSED) for v in variants for r in v.regions):
        lines.append(f"# Convolutions: {CONV_NOTE}")
    lines.append("# Training: each fused region is a torch.autograd.Function (used only when a gradient is needed).")
    lines += [f"# {ln}" for ln in verified]
    return [w for ln in lines for w in textwrap.wrap(ln, 118, subsequent_indent="#     ")]


def imports(forward_lines: Sequence[str], lib: Library) -> str:
    """The runtime's standard-library imports, the modules kept torch calls name (`operator.floordiv`), torch."""
    return "\n".join(sorted({*lib.imports, *call_imports(forward_lines)})) + "\n\nimport torch"


def emit_cuda(problem_source: str, problem_name: str, variants: Sequence[Variant], scheme: str,
              verified: Sequence[str] = ()) -> str:
    """The ModelNew file of the CUDA backend. `verified`: header lines summarising the verification."""
    if not any(r.fused for v in variants for r in v.regions):
        return emit(problem_source, problem_name, variants, scheme, verified)
    stems: set[str] = set()
    classes: set[str] = set()
    forwards, fused = [], []
    for v in variants:
        lines, codes = _forward_lines(v, stems, classes)
        forwards.append((v, lines))
        fused += codes
    strict = any(v.unfused for v in variants)
    future, original = _split_future(problem_source)
    functions = ("split_rows", *[c.function for c in fused])
    fixed = {p for c in fused for p in c.parts}  # the fixed CUDA parts the regions call
    cu = cuda_source([c.cu for c in fused], fixed)
    cpp = cpp_source([c.cpp for c in fused], fixed)
    python = [CUDA_MODULE, *[c.python.rstrip("\n") for c in fused],
              model_new(forwards, list(variants[0].graph.inputs)).rstrip("\n")]
    lib = runtime_library(python)
    parts = [
        "\n".join([*future, *header(problem_name, variants, scheme, verified)]),
        imports([ln for _, lines in forwards for ln in lines], lib),
        "# ---------------- the original problem, unchanged ----------------\n" + original.strip("\n"),
    ]
    if strict:
        parts.append(STRICT_FP32)
    parts += [
        *lib.sections,
        "# ---------------- fused regions, generated for this problem ----------------\n"
        f'GEMM_SCHEME = "{scheme}"  # the GEMM scheme of every region (kfuse optimize --scheme)',
        f"CUDA_SRC = r'''\n{cu}'''",
        f"CPP_SRC = r'''\n{cpp}'''",
        f"CUDA_FUNCTIONS = {functions!r}",
        *python,
    ]
    return "\n\n\n".join(parts) + "\n"
