"""Stage 1, load: a KernelBench-format problem file -> a `Problem` (its own namespace, never sys.modules).

A problem file defines `class Model(nn.Module)`, `get_inputs()`, `get_init_inputs()` and module-level
constants those two read. `--set NAME=VALUE` replaces the constant's assignment in the file's syntax tree
before it runs, so constants derived from it (`hidden = 2 * in_features`) follow the override too. A value is a
number or a list/tuple of numbers (`--set layer_sizes=[48,40]`); a name bound with others (`height, width = 128,
128`, `a = b = 3`) is reassigned right after that statement.
Every failure a user can cause is a `ProblemError`: one line naming the file and what is wrong.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kfuse.errors import ProblemError

REQUIRED = ("Model", "get_inputs", "get_init_inputs")
# Constants that stand for the batch: the contract's extra shape adds 37 to the first one present.
BATCH_NAMES = ("batch_size", "batch", "n_batch", "num_batches", "M", "n_rows")


@dataclass(frozen=True)
class Problem:
    """A loaded problem. `namespace` is the executed file's globals (with overrides applied)."""

    path: Path
    source: str
    overrides: Mapping[str, Any]  # numbers and (nested) lists/tuples of numbers: JSON-serializable
    namespace: Mapping[str, Any] = field(repr=False)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def model_cls(self) -> type[torch.nn.Module]:
        return self.namespace["Model"]

    def constants(self) -> dict[str, Any]:
        """Module-level numeric constants, numbers or lists/tuples of numbers (the names --set accepts),
        after overrides."""
        return {k: v for k, v in self.namespace.items() if is_numeric(v) and not k.startswith("_")}

    def init_inputs(self) -> list[Any]:
        args = _call(self, "get_init_inputs")
        if not isinstance(args, (list, tuple)):
            raise ProblemError(f"{self.path}: get_init_inputs() returned {type(args).__name__}, expected a list")
        return list(args)

    def inputs(self, device: str | None = None) -> list[torch.Tensor]:
        """get_inputs(); with `device`, its tensors are created there (a GPU draws random inputs far faster
        than the CPU at full size) and moved there if the file names a device itself."""
        with _on(device):
            args = _call(self, "get_inputs")
        if not isinstance(args, (list, tuple)):
            raise ProblemError(f"{self.path}: get_inputs() returned {type(args).__name__}, expected a list of tensors")
        # a forward may take a plain number beside its tensors (`A * s`, KernelBench level 1 problem 5)
        bad = [type(a).__name__ for a in args if not isinstance(a, (torch.Tensor, int, float, bool))]
        if bad or not any(isinstance(a, torch.Tensor) for a in args):
            what = ", ".join(bad) if bad else "no tensor"
            raise ProblemError(f"{self.path}: get_inputs() must return tensors (and numbers), got {what}")
        return [t.to(device) if device is not None and isinstance(t, torch.Tensor) else t for t in args]

    def build(self, init_inputs: Sequence[Any] | None = None, cls: type | None = None,
              device: str | None = None) -> torch.nn.Module:
        """Construct `cls` (default: Model) from the init inputs; a raising constructor is a ProblemError.
        With `device`, parameters are created (and randomly initialised) there: on a GPU that takes
        milliseconds where the CPU takes seconds for a 32768 x 32768 Linear; "meta" gives shapes only."""
        cls = cls or self.model_cls
        args = self.init_inputs() if init_inputs is None else list(init_inputs)
        try:
            with _on(device):
                model = cls(*args)
        except Exception as err:  # noqa: BLE001 - any constructor failure is the user's to fix
            raise ProblemError(f"{self.path}: {cls.__name__}(*get_init_inputs()) raised {_one_line(err)}") from None
        return model if device is None else model.to(device)

    def with_overrides(self, extra: Mapping[str, Any]) -> "Problem":
        return load_problem(self.path, {**self.overrides, **extra})

    def batch_constant(self) -> str | None:
        consts = self.constants()
        return next((n for n in BATCH_NAMES if isinstance(consts.get(n), int)), None)


def _on(device: str | None) -> Any:
    """torch's default-device context (factory calls without a device= land there), or nothing."""
    return torch.device(device) if device is not None else contextlib.nullcontext()


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_numeric(v: Any) -> bool:
    """A number, or a non-empty list/tuple whose items are numeric (nested: `[(3, 5), (1, 2)]`)."""
    if isinstance(v, (list, tuple)):
        return bool(v) and all(is_numeric(x) for x in v)
    return _is_number(v)


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _call(problem: Problem, fn_name: str) -> Any:
    try:
        return problem.namespace[fn_name]()
    except Exception as err:  # noqa: BLE001
        raise ProblemError(f"{problem.path}: {fn_name}() raised {_one_line(err)}") from None


def parse_set(items: Sequence[str]) -> dict[str, Any]:
    """`["batch_size=64", "scale=0.5", "sizes=[48,40]"]` -> {"batch_size": 64, "scale": 0.5, "sizes": [48, 40]};
    bad items are ProblemErrors."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name.isidentifier():
            raise ProblemError(f"--set {item!r}: expected NAME=VALUE")
        out[name] = parse_value(name, text)
    return out


def parse_value(name: str, text: str) -> Any:
    """A number, or a list/tuple of numbers written as a Python literal (`(3,5)`, `[[1,2],[3,4]]`).
    float() also reads `inf` and `nan`, which are not literals."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        try:
            return float(text)
        except ValueError:
            raise ProblemError(f"--set {name}={text}: value is not a number or a list of numbers") from None
    if not is_numeric(value):
        raise ProblemError(f"--set {name}={text}: value is not a number or a list of numbers")
    return value


def _value_node(value: Any) -> ast.expr:
    """The override as an expression: a constant, or a list/tuple of them (nested)."""
    if isinstance(value, (list, tuple)):
        elts = [_value_node(v) for v in value]
        return ast.List(elts, ast.Load()) if isinstance(value, list) else ast.Tuple(elts, ast.Load())
    return ast.Constant(value)


def _names(target: ast.expr) -> list[str]:
    """Every name a target binds: `a`, `a, (b, c)`, `[a, *b]`."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _names(t)]
    return []


def _apply_overrides(tree: ast.Module, path: Path, overrides: Mapping[str, Any]) -> None:
    """For each override, at module level: `NAME = <expr>` becomes `NAME = <value>` (the file's expression is
    never run); where the statement binds other names too (`h, w = 128, 128`, `a = b = 3`), it runs as written
    and `NAME = <value>` follows it."""
    seen: set[str] = set()
    body: list[ast.stmt] = []
    for stmt in tree.body:
        body.append(stmt)
        if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        elif isinstance(stmt, ast.Assign):
            targets = stmt.targets
        else:
            continue
        hits = [n for n in dict.fromkeys(n for t in targets for n in _names(t)) if n in overrides]
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and hits:
            stmt.value = ast.copy_location(_value_node(overrides[hits[0]]), stmt.value)
        else:
            for name in hits:
                assign = ast.Assign([ast.Name(name, ast.Store())], _value_node(overrides[name]))
                body.append(ast.copy_location(assign, stmt))
        seen.update(hits)
    tree.body = body
    ast.fix_missing_locations(tree)  # the new nodes take their statement's line
    unknown = sorted(set(overrides) - seen)
    if unknown:
        raise ProblemError(f"{path}: --set {unknown[0]}: no module-level constant of that name")


def load_problem(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Problem:
    path = Path(path)
    overrides = dict(overrides or {})
    if not path.is_file():
        raise ProblemError(f"{path}: file not found")
    if path.suffix != ".py":
        raise ProblemError(f"{path}: not a Python file (expected a .py KernelBench problem)")
    try:
        source = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as err:
        raise ProblemError(f"{path}: cannot read as Python source ({_one_line(err)})") from None
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as err:
        raise ProblemError(f"{path}: syntax error at line {err.lineno}: {err.msg}") from None
    original = copy.deepcopy(tree)
    _apply_overrides(tree, path, overrides)

    module = types.ModuleType(f"kfuse_problem_{path.stem}")
    module.__file__ = str(path)
    try:
        exec(compile(tree, str(path), "exec"), module.__dict__)  # noqa: S102 - running the user's problem is the job
    except Exception as err:  # noqa: BLE001
        raise ProblemError(f"{path}: running the file raised {_one_line(err)}") from None
    missing = [n for n in REQUIRED if n not in module.__dict__]
    if missing:
        raise ProblemError(f"{path}: not a KernelBench problem: {', '.join(missing)} missing")
    if not (isinstance(module.Model, type) and issubclass(module.Model, torch.nn.Module)):
        raise ProblemError(f"{path}: Model is not a torch.nn.Module subclass")
    for fn in ("get_inputs", "get_init_inputs"):
        if not isinstance(module.__dict__[fn], Callable):
            raise ProblemError(f"{path}: {fn} is not a function")
    for name in overrides:
        if not is_numeric(_module_value(original, name, module.__dict__)):
            raise ProblemError(f"{path}: --set {name}: {name} is not a numeric constant")
    return Problem(path=path, source=source, overrides=overrides, namespace=module.__dict__)


def _module_value(tree: ast.Module, name: str, namespace: Mapping[str, Any]) -> Any:
    """The constant's value as the file wrote it (before the override), for the 'is it a number' check; where
    the file computes it (`N = 2048 * 2`), the value it has now."""
    expr = assignments(tree).get(name)
    try:
        return ast.literal_eval(expr) if expr is not None else namespace.get(name)
    except (ValueError, SyntaxError, TypeError):
        return namespace.get(name)


def assignments(tree: ast.Module) -> dict[str, ast.expr]:
    """Each name an assignment binds at module level -> the expression of its first binding: `h` -> `128` in
    `h, w = 128, 128`, `b` -> `3` in `a = b = 3`; the whole right side where it cannot be split (`h, w = size`)."""
    out: dict[str, ast.expr] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            pairs = [(stmt.target, stmt.value)]
        elif isinstance(stmt, ast.Assign):
            pairs = [(t, stmt.value) for t in stmt.targets]
        else:
            continue
        while pairs:
            target, value = pairs.pop()
            if isinstance(target, ast.Name):
                out.setdefault(target.id, value)
            elif isinstance(target, (ast.Tuple, ast.List)):
                split = (isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
                         and not any(isinstance(t, ast.Starred) for t in target.elts))
                pairs += zip(target.elts, value.elts) if split else [(ast.Name(n), value) for n in _names(target)]
    return out
