"""The recorded sample batch: the one module that knows its file and its keys.

``sample.safetensors`` holds one training batch as it ran: data inputs,
targets, dropout masks, predictions, buffer updates, the loss, parameter
gradients, and the parameters and buffers of that moment. Adapters write it,
parity and verification read it, and emitted programs read it too: the key
functions below (standard library only) are inlined into every program by
``tracelog.emit.inline``, so a program and this package never disagree.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import numpy as np

SAMPLE_FILE = "sample.safetensors"
LOSS_KEY = "loss"


def input_key(name: str) -> str:
    """A data input of the prediction graph (``x``) or of the loss graph."""
    return "input/" + name


def target_key(name: str) -> str:
    """A target of the loss graph (``target``, ``target_1``, ...)."""
    return "target/" + name


def target_name(k: int) -> str:
    """The loss graph's name for the k-th target tensor."""
    return "target" if k == 0 else f"target_{k}"


def mask_key(k: int) -> str:
    """The mask the k-th dropout node drew, in recording order."""
    return f"mask/{k}"


def rng_key(k: int) -> str:
    """The key under which a program's rng dict holds the k-th mask."""
    return f"mask.{k}"


def loss_mask_key(k: int) -> str:
    """The mask (or draw) the loss graph's k-th random node drew: a dropout
    after the predictions (an auxiliary head applied in the loss, or dropout
    in a loss function), numbered apart from the prediction graph's."""
    return f"loss_mask/{k}"


def loss_rng_key(k: int) -> str:
    """The key under which a loss function's rng dict holds its k-th mask."""
    return f"loss_mask.{k}"


def output_key(role: str) -> str:
    """A prediction output, by its role (``prediction``, ``prediction_1``)."""
    return "output/" + role


def update_key(name: str) -> str:
    """A buffer's value after the batch (batch-norm running statistics)."""
    return "update/" + name


def grad_key(name: str) -> str:
    """The gradient of the loss with respect to a trainable parameter."""
    return "grad/" + name


def param_key(name: str) -> str:
    """A parameter as it was when the batch ran (before the optimizer step)."""
    return "param/" + name


def buffer_key(name: str) -> str:
    """A buffer as it was when the batch ran."""
    return "buffer/" + name


def custom_backward_key(name: str) -> str:
    """A parameter whose gradient in training came through a custom
    ``autograd.Function``'s own backward, which is not the derivative of the
    recorded ops (the float64 reference, and every program, differentiate
    those): [the source's gradient's distance from the reference's, the
    reference's largest value], float64. Every parity check fails on it."""
    return "custom_backward/" + name


def reference_key(key: str) -> str:
    """The float64 reference of a sample entry (``ref64/loss``, ``ref64/grad/w``):
    the batch replayed through the source framework's own kernels in float64."""
    return "ref64/" + key


def scale_key(key: str) -> str:
    """The scale a sample entry is judged at, where the reference gives one
    (``scale64/loss``): for the loss, sum |p * dloss/dp| over the predictions p,
    in float64: what rounding every prediction by one relative unit moves the
    loss by. A loss that is a small difference of larger terms (a mean of
    cosine similarities of either sign) is that sensitive to its input, however
    small its value: its own value would understate the rounding it carries."""
    return "scale64/" + key


def masks_as_rng(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample's dropout masks as the rng dict a program's functions take."""
    return {rng_key(int(k[len("mask/") :])): v for k, v in sample.items() if k.startswith("mask/")}


def loss_masks_as_rng(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample's loss-graph masks as the rng dict a loss function takes."""
    return {
        loss_rng_key(int(k[len("loss_mask/") :])): v
        for k, v in sample.items()
        if k.startswith("loss_mask/")
    }


# The functions an emitted program inlines, in this order.
INLINED = (
    input_key,
    target_key,
    mask_key,
    rng_key,
    output_key,
    update_key,
    grad_key,
    param_key,
    buffer_key,
    reference_key,
    scale_key,
    masks_as_rng,
    loss_mask_key,
    loss_rng_key,
    loss_masks_as_rng,
)


def draw_key(graph_kind: str, k: int) -> str:
    """The rng key of a graph's k-th random node: the loss graph's draws are
    keyed apart from the prediction graph's (loss_rng_key), so one rng dict
    holds both and neither reads the other's."""
    return loss_rng_key(k) if graph_kind == "loss" else rng_key(k)


# -- the package's side: writing and reading the file --------------------------------------------
Arrays = Mapping[str, np.ndarray]


class _SampleInfoLater(TypedDict, total=False):
    # "float64": the sample holds ref64/ entries; otherwise why it has none (logs
    # written before the reference existed have no such key)
    reference: str
    # how many masks the loss graph drew (loss_mask_key); only where it drew any
    loss_masks: int


class SampleInfo(_SampleInfoLater):
    """What trace.json says about the sample (its ``"sample"`` entry)."""

    epoch: int
    batch: int
    phase: str
    prediction: str  # hash of the prediction graph the batch ran
    loss: str  # hash of its loss graph
    masks: int  # how many dropout masks the sample holds
    grads_from: str  # how the source framework took the gradients


def build_sample(
    *,
    inputs: Arrays,
    targets: Arrays,
    masks: Sequence[np.ndarray],
    outputs: Arrays,
    loss_masks: Sequence[np.ndarray] = (),
    loss: np.ndarray,
    grads: Arrays,
    params: Arrays,
    buffers: Arrays,
    updates: Arrays,
    reference: Mapping[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """The sample of one batch, keyed as the file holds it. ``masks`` (the
    prediction graph's) and ``loss_masks`` (the loss graph's) are in node
    order; targets are keyed by their names in the loss graph
    (``tracelog.adapters.builder.target_names``), the rest by name or role.
    ``reference``: the float64 replay's outputs, loss, grads and updates,
    stored under ``reference_key`` of the entries they stand for, and its
    optional "loss_scale" under ``scale_key(LOSS_KEY)``."""
    sample: dict[str, np.ndarray] = {}
    sample.update((input_key(n), a) for n, a in inputs.items())
    sample.update((target_key(n), a) for n, a in targets.items())
    sample.update((mask_key(k), a) for k, a in enumerate(masks))
    sample.update((loss_mask_key(k), a) for k, a in enumerate(loss_masks))
    sample.update((output_key(role), a) for role, a in outputs.items())
    sample[LOSS_KEY] = loss
    sample.update((grad_key(n), a) for n, a in grads.items())
    sample.update((param_key(n), a) for n, a in params.items())
    sample.update((buffer_key(n), a) for n, a in buffers.items())
    sample.update((update_key(n), a) for n, a in updates.items())
    if reference is not None:
        ref: dict[str, np.ndarray] = {LOSS_KEY: reference["loss"]}
        ref.update((output_key(r), a) for r, a in reference["outputs"].items())
        ref.update((grad_key(n), a) for n, a in reference["grads"].items())
        ref.update((update_key(n), a) for n, a in reference["updates"].items())
        sample.update((reference_key(k), a) for k, a in ref.items() if k in sample)
        if reference.get("loss_scale") is not None:
            sample[scale_key(LOSS_KEY)] = np.asarray(reference["loss_scale"], dtype=np.float64)
    return sample


def without_reference(sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The sample less its float64 reference and the scales it gave."""
    dropped = (reference_key(""), scale_key(""))
    return {k: v for k, v in sample.items() if not k.startswith(dropped)}


def sample_info(
    *,
    epoch: int,
    batch: int,
    phase: str,
    prediction: str,
    loss: str,
    masks: int,
    grads_from: str,
    reference: str,
    loss_masks: int = 0,
) -> SampleInfo:
    info: SampleInfo = {
        "epoch": epoch,
        "batch": batch,
        "phase": phase,
        "prediction": prediction,
        "loss": loss,
        "masks": masks,
        "grads_from": grads_from,
        "reference": reference,
    }
    if loss_masks:
        info["loss_masks"] = loss_masks
    return info


def encode_tensors(tensors: Arrays, metadata: dict[str, str] | None = None) -> bytes:
    """The bytes of a safetensors file. bfloat16 arrays (``ml_dtypes.bfloat16``,
    numpy has none of its own) are stored as safetensors' BF16."""
    from safetensors.numpy import save

    # np.require, not np.ascontiguousarray: that one makes a 0-d array (the loss) 1-d
    return save({k: np.require(a, requirements="C") for k, a in tensors.items()}, metadata=metadata)


# safetensors' dtype of each numpy dtype it writes, in the order its writer lays
# tensors out (largest alignment first; one dtype's tensors by name)
_LAYOUT = {
    name: (rank, code)
    for rank, (name, code) in enumerate(
        [
            ("uint64", "U64"),
            ("int64", "I64"),
            ("float64", "F64"),
            ("complex64", "C64"),
            ("float32", "F32"),
            ("uint32", "U32"),
            ("int32", "I32"),
            ("bfloat16", "BF16"),
            ("float16", "F16"),
            ("uint16", "U16"),
            ("int16", "I16"),
            ("float8_e4m3fn", "F8_E4M3"),
            ("float8_e5m2", "F8_E5M2"),
            ("int8", "I8"),
            ("uint8", "U8"),
            ("bool", "BOOL"),
        ]
    )
}


def tensor_pieces(
    tensors: Arrays, metadata: dict[str, str] | None = None
) -> list[bytes | memoryview] | None:
    """``encode_tensors(tensors, metadata)``'s bytes in pieces: the header, then
    each array's own memory (no copy: a writer streams them to the file, where
    the one blob costs two copies of the sample). None where only safetensors
    itself says what it writes (another dtype, a big-endian array, metadata of
    other than one entry, whose order safetensors does not promise)."""
    if metadata is not None and (
        len(metadata) != 1
        or any(type(k) is not str or type(v) is not str for k, v in metadata.items())
    ):
        return None
    laid: list[tuple[int, str, str, np.ndarray]] = []
    for name, a in tensors.items():
        a = np.require(a, requirements="C")
        known = _LAYOUT.get(a.dtype.name)
        if type(name) is not str or known is None or a.dtype.byteorder == ">":
            return None
        laid.append((known[0], name, known[1], a))
    laid.sort(key=lambda e: (e[0], e[1]))
    entries = []
    if metadata is not None:
        entries.append('"__metadata__":' + _json_text(metadata))
    offset = 0
    for _rank, name, code, a in laid:
        end = offset + a.nbytes
        shape = ",".join(str(d) for d in a.shape)
        entries.append(
            f'{_json_text(name)}:{{"dtype":"{code}","shape":[{shape}],"data_offsets":[{offset},{end}]}}'
        )
        offset = end
    header = ("{" + ",".join(entries) + "}").encode()
    header += b" " * (-len(header) % 8)  # the data starts 8-byte aligned
    pieces: list[bytes | memoryview] = [struct.pack("<Q", len(header)) + header]
    pieces += [a.reshape(-1).view(np.uint8).data for _r, _n, _c, a in laid if a.nbytes]
    return pieces


def _json_text(obj: Any) -> str:
    """JSON as safetensors' header writes it (serde_json: compact, UTF-8 as is)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def decode_tensors(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of a safetensors file's bytes, BF16 as ``ml_dtypes.bfloat16``
    (safetensors.numpy itself reads no BF16)."""
    from safetensors import deserialize

    arrays = {}
    for name, view in deserialize(data):
        dtype = _SAFETENSORS_DTYPES.get(view["dtype"])
        if dtype is None:
            dtype = _extra_dtype(view["dtype"])
        arrays[name] = np.frombuffer(view["data"], dtype=dtype).reshape(view["shape"])
    return arrays


_SAFETENSORS_DTYPES: dict[str, Any] = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "U64": np.uint64,
    "I32": np.int32,
    "U32": np.uint32,
    "I16": np.int16,
    "U16": np.uint16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def _extra_dtype(name: str) -> Any:
    if name == "BF16":
        try:
            import ml_dtypes
        except ImportError:
            raise ValueError("a BF16 tensor needs the ml_dtypes package to be read") from None
        return ml_dtypes.bfloat16
    raise ValueError(f"safetensors dtype {name} is not supported")


def encode_sample(sample: Arrays, metadata: dict[str, str] | None = None) -> bytes:
    """The bytes of ``sample.safetensors``."""
    return encode_tensors(sample, metadata)


def decode_sample(data: bytes) -> dict[str, np.ndarray]:
    """The sample from the bytes of ``sample.safetensors``."""
    return decode_tensors(data)


def sample_feeds(sample: Arrays) -> dict[str, np.ndarray]:
    """Graph inputs by name from a sample: data, targets, parameters and
    buffers of that moment, and dropout masks under their rng names."""
    feeds: dict[str, np.ndarray] = {}
    for key, arr in sample.items():
        kind, _, name = key.partition("/")
        if kind in ("input", "param", "buffer", "target"):
            feeds[name] = arr
        elif kind == "mask":
            feeds[rng_key(int(name))] = arr
        elif kind == "loss_mask":
            feeds[loss_rng_key(int(name))] = arr
    return feeds
