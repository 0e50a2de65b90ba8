"""Loading weights.safetensors: what every emitted program carries, the
parity check or not (a program without the check still loads its weights).

Read with numpy from safetensors' own parser, whatever the target: one loader
for every framework, bfloat16 included (numpy has none; _bfloat16 is the
target's). Inlined into each program (``tracelog.emit.inline``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import deserialize

if TYPE_CHECKING:  # defined by the program: its target's runtime and its generated code
    # [name, trains]: the stored weights give each one's shape and dtype
    PARAMETERS: list[list[Any]] = []

    def _as_param(array: np.ndarray, trainable: bool) -> Any: ...
    def _as_const(array: np.ndarray) -> Any: ...
    def _bfloat16(bits: np.ndarray) -> Any: ...


# safetensors' dtype names as numpy reads them; BF16, which numpy lacks, is read by _load
STORED_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
}


def _load(path: str, narrow: bool = False) -> dict[str, Any]:
    """A safetensors file's arrays. bfloat16 is widened to float32, which holds
    it exactly (its bits are a float32's upper half), for comparisons and the
    float64 run; with `narrow`, it stays bfloat16 (_bfloat16: the framework's
    own), so the program runs in the dtypes the source ran in."""
    with open(path, "rb") as f:
        data = f.read()
    arrays = {}
    for name, view in deserialize(data):
        if view["dtype"] == "BF16":
            bits = np.frombuffer(view["data"], dtype="<u2").reshape(view["shape"])
            if narrow:
                arrays[name] = _bfloat16(bits.copy())
                continue
            # a string: np.float32 means float64 in _in_float64
            array = (bits.astype(np.uint32) << 16).view("<f4")
        else:
            array = np.frombuffer(view["data"], dtype=STORED_DTYPES[view["dtype"]]).copy()
        arrays[name] = array.reshape(view["shape"])
    return arrays


def load_params(path: str) -> dict[str, Any]:
    """Read weights.safetensors: parameters as trainable objects of this
    framework, buffers as plain tensors, large constants by key, each in the
    dtype it was stored in."""
    arrays = _load(path, narrow=True)
    params = {name: _as_param(arrays[name], trains) for name, trains, *_ in PARAMETERS}
    params.update({k: _as_const(v) for k, v in arrays.items() if k.startswith("const/")})
    return params


def under(prefix: str, rows: list[list[Any]]) -> list[list[Any]]:
    """A module kind's parameter rows (``BATCH_NORM_PARAMETERS``, names under
    the module) as one of its calls declares them: under the call's prefix."""
    return [[prefix + name, *row] for name, *row in rows]


# What every program inlines from this module, in this order (and `under`,
# before PARAMETERS, where a call of a module kind declares its rows).
INLINED = ("_load", "load_params")
