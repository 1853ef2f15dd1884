"""Region kinds live in one file each (issue 19, item 1), device-free: a kind's name is written only in its own
file, regions/<name>.py, and in the registry, regions/__init__.py (KINDS); partition has no kind-specific branch;
adding a kind is its file plus one registry line."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import kfuse
from kfuse.regions import KINDS

SRC = Path(kfuse.__file__).parent
REGIONS = SRC / "regions"

# The kind of an op kept as a torch call is named "torch", after the library every file imports, so a word search
# would find the library. For it the search is for the name as a string literal where a kind is named: compared
# (`r.kind == "torch"`, `kind in ("torch", ...)`), passed (`kind="torch"`, `kind_of("torch")`) or assigned
# (`name = "torch"`, `kind = "torch"`).
LIBRARY_WORDS = {"torch"}

# Kinds whose name is written in a third file today; strict, so the entry goes when the file stops naming it.
KNOWN: dict[str, str] = {}


def _kind_literals(tree: ast.AST, name: str) -> list[int]:
    """Lines where the string `name` stands where a kind is named (see LIBRARY_WORDS)."""
    found = []
    for node in ast.walk(tree):
        candidates: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                is_collection = isinstance(operand, (ast.Tuple, ast.List, ast.Set))
                candidates += operand.elts if is_collection else [operand]
        elif isinstance(node, ast.keyword) and node.arg == "kind":
            candidates.append(node.value)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "kind_of":
            candidates += node.args
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(getattr(t, "id", getattr(t, "attr", None)) in ("kind", "name") for t in targets):
                candidates.append(node.value)
        found += [c.lineno for c in candidates if isinstance(c, ast.Constant) and c.value == name]
    return found


def names_kind(path: Path, name: str) -> bool:
    """Whether the source file at `path` writes the kind name `name` (a word, comments and docstrings included)."""
    text = path.read_text()
    if name in LIBRARY_WORDS:
        return bool(_kind_literals(ast.parse(text), name))
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def files_naming(name: str) -> list[str]:
    return [str(p.relative_to(SRC)) for p in sorted(SRC.rglob("*.py")) if names_kind(p, name)]


def kind_params():
    return [pytest.param(k.name, id=k.name, marks=[pytest.mark.xfail(strict=True, reason=KNOWN[k.name])]
                         if k.name in KNOWN else []) for k in KINDS]


def kind_modules() -> dict[str, object]:
    """Every module of kfuse/regions that defines a KIND, by file stem."""
    modules = {p.stem: importlib.import_module(f"kfuse.regions.{p.stem}")
               for p in sorted(REGIONS.glob("*.py")) if p.stem != "__init__"}
    return {stem: m for stem, m in modules.items() if hasattr(m, "KIND")}


def test_kind_names_are_distinct():
    names = [k.name for k in KINDS]
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize("name", kind_params())
def test_kind_name_only_in_its_file_and_the_registry(name):
    """Its own file is the module that defines it (regions/<name>.py: test_kind_module_is_named_after_its_kind)."""
    own = [f"regions/{stem}.py" for stem, m in kind_modules().items() if m.KIND.name == name]
    files = files_naming(name)
    print(name, files)
    assert set(files) <= {*own, "regions/__init__.py"}, files


def test_partition_names_no_kind():
    partition = SRC / "partition.py"
    assert [k.name for k in KINDS if names_kind(partition, k.name)] == []


def test_every_kind_module_is_registered():
    """A file of kfuse/regions that defines a KIND is in KINDS (a kind is its file plus its registry line)."""
    modules = kind_modules()
    assert modules, "no module of kfuse/regions defines KIND"
    unregistered = [stem for stem, m in modules.items() if m.KIND not in KINDS]
    assert unregistered == []
    registered = {id(m.KIND) for m in modules.values()}
    assert [k.name for k in KINDS if id(k) not in registered] == []  # and every registered kind has its own file


@pytest.mark.parametrize("name", [
    pytest.param(k.name, id=k.name, marks=[pytest.mark.xfail(
        strict=True, reason="the kind of an op kept as a torch call is reported as 'torch' (README's report table) "
        "and lives in regions/torch_call.py; which of the two is renamed is the lead's call")]
        if k.name == "torch" else []) for k in KINDS])
def test_kind_module_is_named_after_its_kind(name):
    stems = [stem for stem, m in kind_modules().items() if m.KIND.name == name]
    assert stems == [name]
