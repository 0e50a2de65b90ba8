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


# small constants' digests by dtype and bytes: an eager Keras step makes a few
# dozen new ones on every call (a momentum, an epsilon, reshape sizes), each
# digested for the tape's fingerprint (issue 18); bounded
_SMALL: dict[tuple[Any, tuple[int, ...], bytes], str] = {}


def tensor_digest(t: Any) -> str:
    arr = t.numpy() if hasattr(t, "numpy") else np.asarray(t)
    if not isinstance(arr, np.ndarray):  # a scalar's numpy() is a NumPy scalar
        arr = np.asarray(arr)
    data = arr.tobytes()  # C order, whatever the layout
    if len(data) > 256:
        return array_digest(str(arr.dtype), arr.shape, data)
    key = (arr.dtype, arr.shape, data)
    found = _SMALL.get(key)
    if found is None:
        if len(_SMALL) >= 4096:
            _SMALL.clear()
        found = _SMALL[key] = array_digest(str(arr.dtype), arr.shape, data)
    return found
