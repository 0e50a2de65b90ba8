"""``torch.compile`` and the listener: compiled code keeps running compiled.

Dynamo skips a frame when a dispatch mode is on the stack whose
``ignore_compile_internals()`` is False (``convert_frame.py``: "non-infra
torch dispatch mode present"), and it caches that skip for the code object,
so a first compiled call inside a window used to leave the model eager for
the rest of training. The listener's mode says True, and its module hooks
return at once while Dynamo traces (``torch.compiler.is_compiling()`` is a
constant True to Dynamo), so they add neither graph breaks nor ops to the
compiled graphs.

What is recorded: compiled code runs Inductor's kernels, not the aten ops a
window records, so a batch whose model runs compiled is counted unrecorded
with a reason, beside the optimizer steps. A model compiled before the
listener attaches (``torch.compile(model)``, ``model.compile()``) is found at
attach time, gets one warning, and the listener adds nothing to it: no
hooks, no dispatch mode in its windows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, cast

import torch

COMPILED_REASON = (
    "the model runs compiled (torch.compile): its ops run in compiled kernels, not recorded"
)
COMPILED_WARNING = (
    "tracelog: the model is compiled (torch.compile). It keeps running compiled; tracelog "
    "counts its batches (as unrecorded, reason: compiled) and its optimizer steps, and "
    "records no graphs, no sample. To record its graphs, record a few batches of the "
    "model without torch.compile (the same algebra, run eagerly)."
)
MAYBE_COMPILED = (
    "; if it ran compiled (torch.compile after the listener attached, or a compiled "
    "function calling it): compiled code is not recorded"
)


# Is Dynamo tracing this call (hooks then add nothing to the graph)? torch's own
# function, not a wrapper: hooks call it on every module call of a fast window,
# and Dynamo folds it to True by identity.
compiling: Callable[[], bool] = torch.compiler.is_compiling


def unwrap_compiled(model: torch.nn.Module) -> tuple[torch.nn.Module, bool]:
    """The module ``torch.compile(module)`` wraps (its parameters named as the
    user's: no ``_orig_mod.`` prefix), and whether any part of it is compiled."""
    compiled = False
    optimized = _optimized_module_type()
    while optimized is not None and isinstance(model, optimized):
        model, compiled = cast(torch.nn.Module, model._orig_mod), True
    # nn.Module.compile() compiles a module in place
    compiled = compiled or any(
        getattr(m, "_compiled_call_impl", None) is not None for m in model.modules()
    )
    return model, compiled


def dynamo_compiled_something() -> bool:
    """Has Dynamo compiled any frame in this process (without importing it)?"""
    dynamo = sys.modules.get("torch._dynamo.utils")
    counters: Any = getattr(dynamo, "counters", None)
    try:
        return bool(counters is not None and counters["frames"]["ok"] > 0)
    except Exception:  # a torch whose counters differ: no hint, never an error
        return False


def _optimized_module_type() -> type | None:
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None)
