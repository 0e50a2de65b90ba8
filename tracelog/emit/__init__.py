"""Emitters: IR -> programs and models for other frameworks."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

TARGETS = ("tensorflow", "torch", "jax", "onnx")
PROGRAM_TARGETS = ("tensorflow", "torch", "jax")


def get_target(name: str) -> Any:
    if name == "tensorflow":
        from tracelog.emit import tensorflow

        return tensorflow.target()
    if name == "jax":
        from tracelog.emit import jax

        return jax.target()
    if name == "torch":
        from tracelog.emit import pytorch

        return pytorch.target()
    raise ValueError(f"unknown program target {name!r}; choose from {', '.join(PROGRAM_TARGETS)}")


def emit(
    log_dir: str | os.PathLike[str], target: str = "tensorflow", out: str | None = None
) -> Path:
    """Write the program for `target` (model.onnx for "onnx") into the log
    directory (or `out`); return its path.
    Raises tracelog.UnsupportedOpError, writing nothing, when an op has no rule."""
    if target == "onnx":
        from tracelog.emit.onnx_model import write_model

        return write_model(log_dir, out)
    from tracelog.emit.program import write_program

    return write_program(log_dir, get_target(target), out)


class _CallableModule(types.ModuleType):
    """`tracelog.emit(log_dir, target=...)` is the public API, and `tracelog.emit`
    is also this package (DESIGN.md's layout): importing a submodule rebinds
    the package attribute, so the package itself must be the callable."""

    def __call__(
        self, log_dir: str | os.PathLike[str], target: str = "tensorflow", out: str | None = None
    ) -> Path:
        return emit(log_dir, target, out)


sys.modules[__name__].__class__ = _CallableModule
