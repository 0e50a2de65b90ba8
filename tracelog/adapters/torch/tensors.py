"""PyTorch tensors as the tape sees them: dtype names, constant digests, the
tensors of an op's result, and arrays for the log."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tracelog.ir import array_digest

_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}

# by name: the tape's dtypes as torch dtypes (meta replays build tensors of them)
TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported by tracelog") from None


def tensor_digest(t: torch.Tensor) -> str:
    arr = t.detach().cpu().contiguous()
    # reshape(-1): a 0-dim tensor of a wider dtype cannot be viewed as bytes
    data = arr.reshape(-1).view(torch.uint8).numpy().tobytes() if arr.numel() else b""
    return array_digest(dtype_name(arr.dtype), tuple(arr.shape), data)


def flatten_tensors(out: Any, found: list[torch.Tensor]) -> None:
    """The tensors of an op's result, in order (tuples and lists flattened)."""
    if isinstance(out, torch.Tensor):
        found.append(out)
    elif isinstance(out, (list, tuple)):
        for o in out:
            flatten_tensors(o, found)


def to_numpy(t: torch.Tensor) -> Any:
    """A view of the tensor's data (for constants the Builder copies anyway)."""
    t = t.detach().cpu()
    return _bfloat16(t) if t.dtype == torch.bfloat16 else t.numpy()


def to_array(t: torch.Tensor) -> np.ndarray:
    """A contiguous copy of the tensor's data that the log owns (sample, weights)."""
    t = t.detach().cpu().contiguous()
    return (_bfloat16(t) if t.dtype == torch.bfloat16 else t.numpy()).copy()


def _bfloat16(t: torch.Tensor) -> np.ndarray:
    """numpy has no bfloat16: the same bits as ``ml_dtypes.bfloat16`` (which
    safetensors stores as BF16), or, without ml_dtypes, the exact float32 values."""
    try:
        import ml_dtypes
    except ImportError:
        return t.float().numpy()
    return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)


_aten = torch.ops.aten
# in-place view ops (they change a tensor's shape, not its values) and their
# out-of-place forms: a replay runs these, so that a tensor an earlier record made
# keeps the shape it had (torch.quantile squeezes its result in place)
OUT_OF_PLACE_VIEWS = {
    "aten.squeeze_.dim": _aten.squeeze.dim,
    "aten.squeeze_.dims": _aten.squeeze.dims,
    "aten.squeeze_.default": _aten.squeeze.default,
    "aten.unsqueeze_.default": _aten.unsqueeze.default,
    "aten.transpose_.default": _aten.transpose.int,
    "aten.t_.default": _aten.t.default,
}
