"""The `kfuse` command: optimize, bench, eval, eval-suite, report.

Every user-facing failure is a KfuseError: one line on stderr and its exit code, never a traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import typer


def _wants_interpreter(argv: list[str]) -> bool:
    """True for `--device cpu`, or where no GPU is present: Triton reads TRITON_INTERPRET once, when imported."""
    if "--device=cpu" in argv or any(a == "--device" and b == "cpu" for a, b in zip(argv, argv[1:])):
        return True
    import torch

    return not torch.cuda.is_available()


if _wants_interpreter(sys.argv[1:]):
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first `import triton` (commands below)

from kfuse.errors import KfuseError  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Fuse small PyTorch models into verified Triton kernels, benchmark them, judge candidates.")


def register(name: str, fn: Callable[..., Any]) -> None:
    """Add a command whose KfuseErrors become one line on stderr and their exit code."""

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KfuseError as err:
            typer.echo(f"kfuse: error: {err}", err=True)
            raise typer.Exit(err.exit_code) from None

    app.command(name)(command)


def main() -> None:
    try:
        app()
    except KfuseError as err:  # raised outside a command (e.g. while parsing)
        typer.echo(f"kfuse: error: {err}", err=True)
        sys.exit(err.exit_code)


# --- commands from other modules register below (one import + one app.command line each) ---
from kfuse.bench import bench_cmd  # noqa: E402
from kfuse.commands import optimize_cmd  # noqa: E402
from kfuse.judge.commands import eval_cmd, eval_suite_cmd, report_cmd  # noqa: E402

register("optimize", optimize_cmd)
register("bench", bench_cmd)

register("eval", eval_cmd)
register("eval-suite", eval_suite_cmd)
register("report", report_cmd)


if __name__ == "__main__":
    main()
