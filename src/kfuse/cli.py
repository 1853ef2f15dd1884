"""The `kfuse` command: optimize, bench, eval, eval-suite, report.

Every user-facing failure is a KfuseError: one line on stderr and its exit code, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from kfuse.errors import KfuseError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Fuse small PyTorch models into verified Triton kernels, benchmark them, judge candidates.")


def main() -> None:
    try:
        app()
    except KfuseError as err:
        typer.echo(f"kfuse: error: {err}", err=True)
        sys.exit(err.exit_code)


# --- commands from other modules register below (one import + one app.command line each) ---
from kfuse.commands import optimize_cmd  # noqa: E402
from kfuse.judge.commands import eval_cmd, eval_suite_cmd, report_cmd  # noqa: E402

app.command("optimize")(optimize_cmd)

app.command("eval")(eval_cmd)
app.command("eval-suite")(eval_suite_cmd)
app.command("report")(report_cmd)
