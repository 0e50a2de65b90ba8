"""The parity check every emitted program carries: load the weights and the
recorded sample, replay the sample batch through the program's functions, and
compare predictions, buffer updates, loss and gradients with the recording.

Inlined into each program (``tracelog.emit.inline``); the names below under
TYPE_CHECKING are what the program defines around these functions.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors.numpy import load_file

if TYPE_CHECKING:  # defined by the program: its target's runtime and its generated code
    from tracelog.sample import buffer_key, grad_key, output_key, param_key, update_key

    PARAMETERS: list[tuple[str, bool]] = []

    def _as_param(array: np.ndarray, trainable: bool) -> Any: ...
    def _as_const(array: np.ndarray) -> Any: ...
    def _numpy(x: Any) -> np.ndarray: ...
    def _value_and_grads(
        step: Callable[[dict[str, Any]], tuple[dict[str, Any], Any]],
        params: dict[str, Any],
        trainable: list[str],
    ) -> tuple[dict[str, Any], Any, list[Any]]: ...
    def sample_step(params: dict[str, Any], sample: dict[str, np.ndarray]) -> tuple[Any, Any]: ...


Row = tuple[str, float, float, bool]


def load_params(path: str) -> dict[str, Any]:
    """Read weights.safetensors: parameters as trainable objects of this
    framework, buffers as plain tensors, large constants by key."""
    arrays = load_file(path)
    params = {name: _as_param(arrays[name], trainable) for name, trainable in PARAMETERS}
    params.update({k: _as_const(v) for k, v in arrays.items() if k.startswith("const/")})
    return params


def _compare(name: str, got: Any, want: np.ndarray, atol: float, rtol: float) -> Row:
    got = np.asarray(_numpy(got), dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return name, float("inf"), float("inf"), False
    err = np.abs(got - want)
    rel = err / np.maximum(np.abs(want), 1e-12)
    ok = bool(np.all(err <= atol + rtol * np.abs(want)))
    return name, float(err.max(initial=0.0)), float(rel.max(initial=0.0)), ok


def sample_params(log_dir: str) -> dict[str, Any]:
    """The parameters and buffers as they were when the sample batch ran."""
    sample = load_file(os.path.join(log_dir, "sample.safetensors"))
    weights = load_file(os.path.join(log_dir, "weights.safetensors"))
    params = {}
    for name, trainable in PARAMETERS:
        key = param_key(name) if param_key(name) in sample else buffer_key(name)
        params[name] = _as_param(sample[key], trainable)
    params.update({k: _as_const(v) for k, v in weights.items() if k.startswith("const/")})
    return params


def _runs(
    step: Callable[[dict[str, Any]], tuple[Any, Any]], params: dict[str, Any], trainable: list[str]
) -> list[tuple[str, tuple[dict[str, Any], Any, list[Any]]]]:
    """The runs the parity check compares with the recording: one, eager (a
    target's runtime may define its own, as JAX does: jitted and op by op)."""
    return [("", _value_and_grads(step, params, trainable))]


def check_parity(
    log_dir: str, atol: float = 1e-5, rtol: float = 1e-4, grad_atol: float = 1e-4
) -> list[Row]:
    """Replay the recorded batch with the parameters of that moment; compare
    predictions, buffer updates, loss and parameter gradients."""
    sample = load_file(os.path.join(log_dir, "sample.safetensors"))
    params = sample_params(log_dir)
    trainable = [name for name, flag in PARAMETERS if flag]

    def step(p: dict[str, Any]) -> tuple[Any, Any]:
        return sample_step(p, sample)

    rows = []
    for label, (outputs, loss, grads) in _runs(step, params, trainable):
        for role, value in outputs.items():
            if role.startswith("prediction"):
                rows.append(_compare(role + label, value, sample[output_key(role)], atol, rtol))
            elif role.startswith("update:"):
                want = sample[update_key(role[len("update:") :])]
                rows.append(_compare(role + label, value, want, atol, rtol))
        rows.append(_compare("loss" + label, loss, sample["loss"], atol, rtol))
        for name, grad in zip(trainable, grads, strict=True):
            if grad_key(name) in sample:
                want = sample[grad_key(name)]
                got = np.zeros_like(want) if grad is None else grad
                rows.append(_compare("grad " + name + label, got, want, grad_atol, rtol))
    return rows


def main() -> int:
    log_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    rows = check_parity(log_dir)
    width = max(len(r[0]) for r in rows)
    print(f"{'output':<{width}}  {'max abs err':>12}  {'max rel err':>12}  ok")
    for name, err, rel, ok in rows:
        print(f"{name:<{width}}  {err:>12.3e}  {rel:>12.3e}  {'yes' if ok else 'NO'}")
    ok = all(r[3] for r in rows)
    print("parity: ok" if ok else "parity: MISMATCH")
    return 0 if ok else 1


# What every program inlines from this module, in this order.
INLINED = ("load_params", "_compare", "sample_params", "_runs", "check_parity", "main")
