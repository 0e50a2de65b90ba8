"""Errors a user can cause, each with a one-line message."""

from __future__ import annotations


class TracelogError(Exception):
    """Base class for every error tracelog raises on purpose."""


class LogError(TracelogError):
    """A log directory is missing, corrupt, truncated or from a newer tracelog."""


class LogExistsError(TracelogError, FileExistsError):
    """A listener was pointed at a directory that already holds a log."""


class UnsupportedOpError(TracelogError):
    """A graph holds ops that a target has no rule for.

    ``ops`` lists (op, count, module paths) for each such op.
    """

    def __init__(self, target: str, ops: list[tuple[str, int, list[str]]]) -> None:
        self.target = target
        self.ops = ops
        listed = "; ".join(
            f"{op} x{count} in {', '.join(mods) or '<root>'}" for op, count, mods in ops
        )
        super().__init__(f"{len(ops)} op(s) unsupported by target {target}: {listed}")
