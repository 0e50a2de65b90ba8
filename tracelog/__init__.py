"""tracelog: record the algebra of real training runs, deduplicated with usage
counts, and emit it as programs for other frameworks."""

from __future__ import annotations

import importlib
import os
from typing import Any

from tracelog import (
    compare,  # callable: tracelog.compare(a, b) -> Comparison
    diff,  # callable: tracelog.diff(old, new) -> LogDiff
    emit,  # callable: tracelog.emit(log_dir, target=...)
)
from tracelog.errors import LogError, LogExistsError, TracelogError, UnsupportedOpError
from tracelog.ir import BATCH, Graph, Node, TensorType, Value
from tracelog.log import TraceLog, load

__version__ = "0.1.0"


def Listener(model: Any, log_dir: str | os.PathLike[str], **options: Any) -> Any:
    """A training listener for ``model``, picked by the model's framework.

    PyTorch: ``tracelog.Listener(torch_module, "runs/x")`` returns a
    :class:`tracelog.adapters.torch.TorchListener`; a Keras model (TensorFlow
    backend, eager loop) a :class:`tracelog.adapters.tensorflow.TFListener`.
    """
    module = type(model).__module__
    if _is_torch_module(model):
        from tracelog.adapters.torch import TorchListener

        return TorchListener(model, log_dir, **options)
    if _is_keras_model(model):
        from tracelog.adapters.tensorflow import TFListener

        return TFListener(model, log_dir, **options)
    raise TypeError(
        f"tracelog has no listener for {module}.{type(model).__name__}; "
        "it records torch.nn.Module and Keras models"
    )


def _is_keras_model(model: Any) -> bool:
    """Whether model is a Keras layer or model: by its classes' modules, so a
    subclass defined in user code counts (keras is never imported here: a
    Keras object means keras was imported already)."""
    return any(
        c.__module__.startswith(("keras", "tf_keras")) and c.__name__ in ("Layer", "Model")
        for c in type(model).__mro__
    )


def _is_torch_module(model: Any) -> bool:
    """Whether model is a torch.nn.Module (False where torch is not installed)."""
    try:
        import torch
    except ImportError:
        return False
    return isinstance(model, torch.nn.Module)


__all__ = [
    "BATCH",
    "check",
    "compare",
    "diff",
    "emit",
    "Graph",
    "Listener",
    "LogError",
    "LogExistsError",
    "Node",
    "TensorType",
    "TraceLog",
    "TracelogError",
    "UnsupportedOpError",
    "Value",
    "load",
]


# they import a framework: loaded on first use
_LAZY_SUBMODULES = ("keras", "lightning", "transformers")


def __getattr__(name: str) -> Any:
    """``tracelog.keras`` (``.lightning``, ``.transformers``) without importing
    the framework at ``import tracelog`` (PEP 562)."""
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check(
    log_dir: str | os.PathLike[str],
    target: str = "tensorflow",
    *,
    draw: int = 0,
    **tolerances: float,
) -> Any:
    """Emit and run the program for ``target`` on the recorded batch; a report
    with per-output max abs/rel errors and ``.ok`` (``draw``: tracelog.parity.check)."""
    from tracelog.parity import check as _check

    return _check(log_dir, target, draw=draw, **tolerances)
