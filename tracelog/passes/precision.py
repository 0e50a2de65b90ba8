"""A graph in float64: every float32 value, cast and constant widened.

The translation check runs the IR (the ONNX target's graphs) in float64
against the sample's float64 reference, so a difference is the translation's
and never float32 rounding. Other dtypes (integers, booleans, float16) stay.
"""

from __future__ import annotations

import copy

import numpy as np

from tracelog.ir import Graph, TensorType

# attributes that name a dtype (Cast's target; the random-like ops' output type)
_DTYPE_ATTRS = {("Cast", "to"), ("RandomUniformLike", "dtype"), ("RandomNormalLike", "dtype")}


def promoted_float64(graph: Graph) -> Graph:
    """A copy of `graph` computing in float64 where it computed in float32."""
    wide = copy.deepcopy(graph)
    for v in wide.values.values():
        if v.type.dtype == "float32":
            v.type = TensorType("float64", v.type.shape)
    for node in wide.nodes:
        for key, value in node.attrs.items():
            if (node.op, key) in _DTYPE_ATTRS and value == "float32":
                node.attrs[key] = "float64"
    return wide


def promoted_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds and constants for a promoted graph: float32 arrays in float64."""
    return {k: a.astype(np.float64) if a.dtype == np.float32 else a for k, a in arrays.items()}
