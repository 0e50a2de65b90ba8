"""The target registry: the one place that names each target, the module
that writes it, the file it writes and how its parity check runs. The CLI,
``tracelog.emit``, ``tracelog.check`` and the README's support table read it;
adding a target is one ``register`` call (and its module)."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tracelog.emit.common import LINE_LENGTH

if TYPE_CHECKING:
    from tracelog.emit.program import Target
    from tracelog.registry import Table
    from tracelog.verify import Report

PROGRAM = "program"  # a Python program: the module defines TARGET (tracelog.emit.program)
MODEL = "model"  # a model file: the module defines TABLE, write_model and check_model


@dataclass(frozen=True)
class TargetSpec:
    name: str
    title: str
    kind: str
    module: str  # imported on first use: targets cost nothing until asked for
    file_name: str
    framework: str  # the package the emitted code runs on (what a test or user must install)

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    @property
    def program(self) -> Target:
        if self.kind != PROGRAM:
            raise ValueError(f"{self.name} is not a program target")
        return self.load().TARGET

    @property
    def table(self) -> Table[Any]:
        module = self.load()
        return module.TARGET.table if self.kind == PROGRAM else module.TABLE

    def emit(
        self,
        log_dir: str | os.PathLike[str],
        out: str | None = None,
        line_length: int = LINE_LENGTH,
        standalone: bool = False,
    ) -> Path:
        """Write the target's file; a program is black-formatted at
        `line_length`, and carries the parity check if `standalone`."""
        if self.kind == PROGRAM:
            from tracelog.emit.program import write_program

            return write_program(log_dir, self.program, out, line_length, standalone)
        return self.load().write_model(log_dir, out)

    def check(
        self,
        log_dir: str | os.PathLike[str],
        *,
        atol: float,
        rtol: float,
        grad_atol: float,
        draw: int = 0,
    ) -> Report:
        if self.kind == PROGRAM:
            from tracelog.parity import check_program

            return check_program(
                log_dir, self.program, atol=atol, rtol=rtol, grad_atol=grad_atol, draw=draw
            )
        if draw:
            raise ValueError(f"draw={draw}: draws are run by program targets, not {self.name}")
        return self.load().check_model(log_dir, atol=atol, rtol=rtol)


_TARGETS: dict[str, TargetSpec] = {}


def register(spec: TargetSpec) -> TargetSpec:
    if spec.name in _TARGETS:
        raise ValueError(f"target {spec.name} is registered twice")
    if spec.kind not in (PROGRAM, MODEL):
        raise ValueError(f"target {spec.name}: unknown kind {spec.kind!r}")
    _TARGETS[spec.name] = spec
    return spec


def get(name: str) -> TargetSpec:
    try:
        return _TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; choose from {', '.join(names())}") from None


def names(kind: str | None = None) -> tuple[str, ...]:
    """Target names in registration order (optionally of one kind)."""
    return tuple(n for n, s in _TARGETS.items() if kind is None or s.kind == kind)


def file_name(name: str) -> str:
    return get(name).file_name


register(
    TargetSpec(
        "tensorflow",
        "TensorFlow",
        PROGRAM,
        "tracelog.emit.tensorflow",
        "program_tensorflow.py",
        "tensorflow",
    )
)
register(
    TargetSpec("torch", "PyTorch", PROGRAM, "tracelog.emit.pytorch", "program_torch.py", "torch")
)
register(TargetSpec("jax", "JAX", PROGRAM, "tracelog.emit.jax", "program_jax.py", "jax"))
register(TargetSpec("onnx", "ONNX", MODEL, "tracelog.emit.onnx_model", "model.onnx", "onnxruntime"))
