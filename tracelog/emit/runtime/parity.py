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
    from tracelog.sample import (
        buffer_key,
        grad_key,
        output_key,
        param_key,
        reference_key,
        update_key,
    )

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


# (output, max abs err, max rel err, ok, the source's own float32 error, ratio); the
# last two are None where the sample has no float64 reference
Row = tuple[str, float, float, bool, float | None, float | None]

# Against the sample's float64 reference, a float32 result is within FLOAT32_FACTOR
# times the source framework's own float32 error; for an output the source computes
# exactly, within FLOOR_ULPS float32 ulps of its largest value. (The ratio is printed
# beside the atol/rtol verdict until the float64 translation check judges correctness.)
FLOAT32_FACTOR = 4.0
FLOOR_ULPS = 4.0


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
        return name, float("inf"), float("inf"), False, None, None
    err = np.abs(got - want)
    rel = err / np.maximum(np.abs(want), 1e-12)
    ok = bool(np.all(err <= atol + rtol * np.abs(want)))
    return name, float(err.max(initial=0.0)), float(rel.max(initial=0.0)), ok, None, None


def _error(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest |got - ref|; equal values (the same infinity) agree, NaN is inf."""
    with np.errstate(invalid="ignore"):
        err = np.where(got == ref, 0.0, np.abs(got - ref))
    return float(np.nan_to_num(err, nan=np.inf).max(initial=0.0))


def _calibrated(name: str, got: Any, source: np.ndarray, ref: np.ndarray) -> Row:
    """The program's float32 result against the float64 reference, judged by the
    source framework's own float32 error against the same reference: (name,
    error, relative error, within FLOAT32_FACTOR, the source's error, ratio)."""
    got = np.asarray(_numpy(got), dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return name, float("inf"), float("inf"), False, None, None
    err = _error(got, ref)
    own = _error(np.asarray(source, dtype=np.float64), ref)
    scale = float(np.abs(ref[np.isfinite(ref)]).max(initial=0.0))
    unit = max(own, FLOOR_ULPS * 2.0**-23 * scale, np.finfo(np.float64).tiny)
    rel = err / max(scale, 1e-12)
    return name, err, rel, err <= FLOAT32_FACTOR * unit, own, err / unit


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

    def row(name: str, got: Any, key: str, atol: float) -> Row:
        """The verdict: within atol/rtol of the recorded float32 value; beside it,
        where the sample has a float64 reference, the source's own float32 error
        against it and the ratio of this program's error to that."""
        checked = _compare(name, got, sample[key], atol, rtol)
        if reference_key(key) not in sample:
            return checked
        calibrated = _calibrated(name, got, sample[key], sample[reference_key(key)])
        return (*checked[:4], calibrated[4], calibrated[5])

    rows = []
    for label, (outputs, loss, grads) in _runs(step, params, trainable):
        for role, value in outputs.items():
            if role.startswith("prediction"):
                rows.append(row(role + label, value, output_key(role), atol))
            elif role.startswith("update:"):
                rows.append(row(role + label, value, update_key(role[len("update:") :]), atol))
        rows.append(row("loss" + label, loss, "loss", atol))
        for name, grad in zip(trainable, grads, strict=True):
            if grad_key(name) in sample:
                got = np.zeros_like(sample[grad_key(name)]) if grad is None else grad
                rows.append(row("grad " + name + label, got, grad_key(name), grad_atol))
    return rows


def print_table(rows: list[Row]) -> None:
    """One line per output: its error against the recorded value, and where
    there is a float64 reference the source's own float32 error against it and
    the ratio of this program's error against it to that."""
    width = max(len(r[0]) for r in rows)
    print(f"{'output':<{width}}  {'max abs err':>12}  {'source f32 err':>14}  {'ratio':>7}  ok")
    for name, err, _rel, ok, own, ratio in rows:
        own_text = "-" if own is None else f"{own:.3e}"
        ratio_text = "-" if ratio is None else f"{ratio:.2f}"
        print(
            f"{name:<{width}}  {err:>12.3e}  {own_text:>14}  {ratio_text:>7}  {'yes' if ok else 'NO'}"
        )


def main() -> int:
    log_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    rows = check_parity(log_dir)
    print_table(rows)
    ok = all(r[3] for r in rows)
    print("parity: ok" if ok else "parity: MISMATCH")
    return 0 if ok else 1


# What every program inlines from this module, in this order.
INLINED = (
    "load_params",
    "_compare",
    "_error",
    "_calibrated",
    "sample_params",
    "_runs",
    "check_parity",
    "print_table",
    "main",
)
