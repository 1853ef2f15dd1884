"""The library part of a generated file: the definitions of kfuse's runtime modules its code uses, found by following
names (the Triton backend's: kfuse/kernels/, MODULES; the CUDA backend's: CUDA_MODULES).

Every module is read as top-level definitions (functions, classes, assignments, and `try` blocks
that bind names, such as the optional Gluon import). Starting from the names the generated regions and ModelNew
read, the definitions they need are collected transitively; they are written module by module, each in its
file's order (module-level values only ever read earlier definitions), under a banner naming the source file.
The standard-library imports those definitions read come back as import lines for the file's header; kfuse's own
imports between the modules are dropped (the definitions sit in one file).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).parent
Modules = tuple[tuple[str, str], ...]  # (path under kfuse/ without .py, banner title), in the order written
# The Triton backend's modules, in the order their definitions are written: a module reads only those before it at
# import time.
MODULES: Modules = (
    ("kernels/pointwise", "helpers of the pointwise table's spellings"),
    ("kernels/gemm_core", "fp32-accurate GEMM core"),
    ("kernels/gemm_sm90", "the GEMM tile on Hopper, in Gluon"),
    ("kernels/skinny", "skinny GEMMs: the float64 split-K pass"),
    ("kernels/long_k", "long-K GEMMs: K slices summed in float64"),
    ("kernels/runtime", "run-time helpers: operands, tile configs, tuning"),
    ("kernels/conv_geometry", "convolutions: the geometry"),
    ("kernels/conv_pack", "convolutions: the packed operands"),
    ("kernels/conv_config", "convolutions: the tile's configs, tuning and grid"),
    ("kernels/conv_direct", "convolutions of few channels a group: the direct loop"),
    ("kernels/conv_sm90", "convolutions: the tile on Hopper, in Gluon"),
    ("kernels/conv", "convolutions: the implicit-GEMM tile"),
    ("kernels/conv_phases", "transposed convolutions: the stride phases"),
    ("kernels/conv_transpose", "transposed convolutions: the stride-phase tile"),
    ("kernels/conv_depthwise", "depthwise convolutions: the direct tile"),
    ("kernels/batchnorm", "BatchNorm's statistics and eval fold"),
    ("kernels/conv_norm", "BatchNorm after a convolution: counted statistics, eval fold"),
    ("kernels/pool_geometry", "pools after a convolution: the geometry"),
    ("kernels/pooling", "pools after a convolution: rows of pooled pixels, global means"),
    ("kernels/conv_reduce", "reductions over a convolution's channels: the pixel of a phase row"),
    ("kernels/backward_ops", "training: epilogue backward launcher"),
    ("kernels/backward", "training: autograd bases, backward GEMM"),
    ("kernels/graphs", "CUDA graphs for repeated inference calls"),
)
# The CUDA backend's (no Triton): the autograd helpers both backends share, then its own runtime.
CUDA_MODULES: Modules = (
    ("kernels/backward", "autograd helpers, BatchNorm's forward state"),
    ("kernels/conv_geometry", "a convolution's sizes"),
    ("kernels/conv_phases", "a transposed convolution's stride phases"),
    ("kernels/pool_geometry", "a pool's sizes after a convolution"),
    ("cuda/runtime", "the CUDA runtime: build once, operands, autograd"),
    ("cuda/conv_runtime", "convolutions: the weight's rows, the tile's launches"),
)
ALWAYS_IMPORTED = ("torch", "triton", "tl")  # the generated file's own imports


@dataclass(frozen=True)
class Definition:
    module: str
    order: int  # position in its module
    source: str
    reads: frozenset[str]


def bound_names(stmt: ast.stmt) -> list[str]:
    """The module-level names a statement binds (imports excluded: they are the header's)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(stmt, ast.Try):  # an optional import: every name bound in any branch
        inner = [s for part in (stmt.body, stmt.orelse, stmt.finalbody, *[h.body for h in stmt.handlers])
                 for s in part]
        names = [a.asname or a.name.split(".")[0] for s in inner if isinstance(s, (ast.Import, ast.ImportFrom))
                 for a in s.names]
        return names + [n for s in inner for n in bound_names(s)]
    return []


def _reads(node: ast.AST) -> frozenset[str]:
    return frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))


def _source(lines: list[str], stmt: ast.stmt) -> str:
    start = min([d.lineno for d in getattr(stmt, "decorator_list", [])] + [stmt.lineno])
    return "\n".join(lines[start - 1:stmt.end_lineno])


@functools.cache
def _module(name: str) -> tuple[dict[str, Definition], dict[str, str]]:
    """A module's definitions by name, and its standard imports: bound name -> import line."""
    text = (PACKAGE / f"{name}.py").read_text()
    lines = text.splitlines()
    defs: dict[str, Definition] = {}
    imports: dict[str, str] = {}
    for i, stmt in enumerate(ast.parse(text).body):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            if isinstance(stmt, ast.ImportFrom) and (stmt.module or "").startswith(("kfuse", "__future__")):
                continue
            for a in stmt.names:
                bound = a.asname or a.name.split(".")[0]
                if isinstance(stmt, ast.Import):
                    imports[bound] = f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
                else:
                    imports[bound] = f"from {stmt.module} import {a.name}" + (f" as {a.asname}" if a.asname else "")
            continue
        d = Definition(name, i, _source(lines, stmt), _reads(stmt))
        for bound in bound_names(stmt):
            defs.setdefault(bound, d)
    return defs, imports


def _all_definitions(modules: Modules) -> dict[str, Definition]:
    out: dict[str, Definition] = {}
    for module, _ in modules:
        for name, d in _module(module)[0].items():
            out.setdefault(name, d)  # a name defined twice: the earlier module's (modules never shadow)
    return out


def free_names(code: str) -> set[str]:
    """Names a piece of generated Python reads (an ast walk: what it would look up when it runs)."""
    return set(_reads(ast.parse(code)))


@dataclass(frozen=True)
class Library:
    sections: tuple[str, ...]  # one per module used: its banner and definitions
    imports: tuple[str, ...]  # standard-library import lines the definitions and `roots` need
    early: tuple[str, ...]  # definitions the generated code needs when it is defined (decorators), in order
    names: frozenset[str]  # every library name the file defines


def _closure(roots: Iterable[str], defs: dict[str, Definition], exclude: set[str]) -> set[str]:
    need: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in need or name in exclude or name not in defs:
            continue
        need.add(name)
        todo += defs[name].reads
    return need


def _ordered(names: set[str], defs: dict[str, Definition], modules: Modules) -> list[Definition]:
    chosen = {id(defs[n]): defs[n] for n in names}.values()
    rank = {m: i for i, (m, _) in enumerate(modules)}
    return sorted(chosen, key=lambda d: (rank[d.module], d.order))


def library(roots: Iterable[str], exclude: Sequence[str] = (), early: Sequence[str] = (),
            modules: Modules = MODULES) -> Library:
    """The definitions `roots` need, transitively, written module by module; `exclude`: names the generated file
    defines itself (e.g. the GEMM scheme it was built for); `early`: names among them the generated code needs
    at its own definition (with what they need: `Library.early`, not in the sections); `modules`: where they are
    looked for."""
    defs = _all_definitions(modules)
    roots = set(roots)
    need = _closure(roots, defs, set(exclude))
    first = _closure([n for n in early if n in need], defs, set(exclude))
    reads = roots.union(*(defs[n].reads for n in need))
    ordered = _ordered(need - first, defs, modules)
    sections = []
    for module, title in modules:
        mine = [d for d in ordered if d.module == module]
        if mine:
            banner = f"# ---------------- {title} (kfuse/{module}.py) ----------------"
            sections.append(banner + "\n" + "\n\n\n".join(d.source for d in mine))
    imports: dict[str, str] = {}
    for module, _ in modules:
        for bound, line in _module(module)[1].items():
            if bound in reads and bound not in ALWAYS_IMPORTED:
                imports.setdefault(bound, line)
    return Library(tuple(sections), tuple(sorted(set(imports.values()))),
                   tuple(d.source for d in _ordered(first, defs, modules)), frozenset(need))
