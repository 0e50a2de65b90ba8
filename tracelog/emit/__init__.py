"""Emitters: IR -> programs and models for other frameworks.

Targets are named in one place, `tracelog.emit.targets`; this package's
`emit` writes any of them."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING

from tracelog.emit import targets
from tracelog.emit.common import LINE_LENGTH

if TYPE_CHECKING:
    from tracelog.emit.program import Target

TARGETS = targets.names()
PROGRAM_TARGETS = targets.names(targets.PROGRAM)


def get_target(name: str) -> Target:
    """The program target `name` (what the shared program emitter is given)."""
    return targets.get(name).program


def emit(
    log_dir: str | os.PathLike[str],
    target: str = "tensorflow",
    out: str | None = None,
    *,
    line_length: int = LINE_LENGTH,
    standalone: bool = False,
) -> Path:
    """Write the program for `target` (model.onnx for "onnx") into the log
    directory (or `out`); return its path. Programs are black-formatted at
    `line_length` (black's default, 88, unless given). A program's __main__
    runs tracelog's parity check on the recorded batch; a `standalone` one
    carries that check, and runs with no tracelog installed.
    Raises tracelog.UnsupportedOpError, writing nothing, when an op has no rule."""
    return targets.get(target).emit(log_dir, out, line_length, standalone)


class _CallableModule(types.ModuleType):
    """`tracelog.emit(log_dir, target=...)` is the public API, and `tracelog.emit`
    is also this package (DESIGN.md's layout): importing a submodule rebinds
    the package attribute, so the package itself must be the callable."""

    def __call__(
        self,
        log_dir: str | os.PathLike[str],
        target: str = "tensorflow",
        out: str | None = None,
        *,
        line_length: int = LINE_LENGTH,
        standalone: bool = False,
    ) -> Path:
        return emit(log_dir, target, out, line_length=line_length, standalone=standalone)


sys.modules[__name__].__class__ = _CallableModule
