"""TensorFlow tensors as the tape sees them: dtype names, constant digests,
and arrays for the log."""

from __future__ import annotations

from typing import Any

import numpy as np

from tracelog.ir import array_digest


def dtype_name(dtype: Any) -> str:
    """The IR's name of a ``tf.DType`` (TensorFlow's own names match it)."""
    return str(dtype.name)


def to_numpy(t: Any) -> np.ndarray:
    return np.asarray(t.numpy() if hasattr(t, "numpy") else t)


def tensor_digest(t: Any) -> str:
    arr = to_numpy(t)
    return array_digest(str(arr.dtype), arr.shape, np.require(arr, requirements="C").tobytes())
