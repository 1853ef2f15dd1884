"""User-facing failures: one clear line and an exit code, never a traceback."""

from __future__ import annotations


class KfuseError(Exception):
    """An error the user can act on. `str(err)` is the one line printed; `exit_code` is returned."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ProblemError(KfuseError):
    """The problem file (or a --set override) is unusable: exit code 2."""


class UnsupportedError(KfuseError):
    """--strict and an op kfuse cannot fuse: exit code 1."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=1)
