"""Keras recurrent layers (LSTM, GRU, SimpleRNN) seen as one call each.

Keras runs a recurrent layer as a loop of per-step ops (``Unpack``, ``Split``,
``TensorListReserve``, a ``while`` loop, ``SelectV2`` per step for a mask); recorded op
by op, the program would grow with the sequence length. So the listener's wrapper of
such a layer's ``call`` hands it to :func:`recurrent_call`: the ops inside run as they
would (same arguments, same numerics) but are not recorded (``_Window.inside``), and one
record stands for the call, named ``keras.LSTM`` / ``keras.GRU`` / ``keras.SimpleRNN``,
with arguments (sequence, mask or None, (initial states), (kernel, recurrent_kernel,
bias or None)) and the layer's configuration as keyword arguments. The rule
(rules_recurrent.py) makes it one ONNX LSTM / GRU / RNN node.

A Bidirectional is not special: it calls its two layers (each one record, the backward
one ``go_backwards``) and flips and merges their outputs with ops recorded as usual.

Forms the ONNX node cannot express are refused here, at record time, so the batch is
counted unrecorded with the reason and training goes on (fail open).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tracelog.adapters.builder import NotSupported

from .tensors import to_numpy

# the cell's class -> the record's op
_CELLS = {"LSTMCell": "keras.LSTM", "GRUCell": "keras.GRU", "SimpleRNNCell": "keras.SimpleRNN"}
# the layers whose call is recorded whole: these, or RNN given one of the cells above
_LAYERS = ("LSTM", "GRU", "SimpleRNN", "RNN")


def is_recurrent(layer: Any) -> bool:
    """Whether the layer is a Keras LSTM, GRU, SimpleRNN or RNN running one of Keras'
    own cells, with Keras' own call: a subclass that overrides ``call`` or
    ``inner_loop``, or a cell of another class (a subclass too), may compute
    something else, so it is recorded op by op."""
    keras_class = next((c for c in type(layer).__mro__ if c.__name__ in _LAYERS), None)
    if keras_class is None or not keras_class.__module__.startswith("keras."):
        return False
    same_code = all(
        getattr(type(layer), m, None) is getattr(keras_class, m, None)
        for m in ("call", "inner_loop")
    )
    cell = getattr(layer, "cell", None)
    cell_class = type(cell)
    return (
        same_code and cell_class.__name__ in _CELLS and cell_class.__module__.startswith("keras.")
    )


def _activation_name(fn: Any) -> str:
    return str(getattr(fn, "__name__", type(fn).__name__))


def recurrent_call(layer: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """What the wrapper calls for a recurrent layer while a window records:
    ``run(window, args, kwargs)`` returns the layer's outputs."""

    def run(w: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        region = w.region()
        if region is None or not w.recording or w.inside:
            return original(*args, **kwargs)
        w.inside += 1
        try:
            out = original(*args, **kwargs)
        finally:
            w.inside -= 1
        w.guarded(_record, w, layer, original, region, args, kwargs, out)
        return out

    return run


def _call_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(sequence, initial states or None, mask or None) of an RNN.call."""
    names = ("sequences", "initial_state", "mask")
    found = [args[k] if k < len(args) else kwargs.get(n) for k, n in enumerate(names)]
    seq, init, mask = found
    if isinstance(mask, (list, tuple)):
        mask = mask[0] if mask else None
    if init is not None and not isinstance(init, (list, tuple)):
        init = [init]
    return seq, (list(init) if init is not None else None), mask


def check_form(layer: Any, training: bool) -> None:
    """Raise NotSupported for a layer the ONNX node cannot express."""
    cell = layer.cell
    name = type(layer).__name__
    rates = {k: float(getattr(cell, k, 0.0) or 0.0) for k in ("dropout", "recurrent_dropout")}
    drawn = [f"{k}={v}" for k, v in rates.items() if v]
    if training and drawn:
        raise NotSupported(
            f"{name} with {' and '.join(drawn)} in training (masks drawn inside the layer)"
        )
    dtypes = {str(v.dtype) for v in cell.weights} | {str(layer.compute_dtype)}
    if len(dtypes) > 1:
        raise NotSupported(f"{name} with weights and compute in {sorted(dtypes)} (mixed precision)")
    if getattr(layer, "stateful", False):
        raise NotSupported(f"{name} with stateful=True (state carried across batches)")
    act = _activation_name(cell.activation)
    if type(cell).__name__ == "SimpleRNNCell":
        if act not in ("tanh", "relu"):
            raise NotSupported(f"SimpleRNN with activation {act!r} (tanh and relu are modelled)")
        return
    rec_act = _activation_name(cell.recurrent_activation)
    if act != "tanh" or rec_act != "sigmoid":
        raise NotSupported(
            f"{name} with activation {act!r} / recurrent_activation {rec_act!r} "
            "(tanh / sigmoid are modelled)"
        )


def check_mask(layer: Any, mask: Any) -> None:
    """The mask must be right padding (ONNX sequence_lens), with no empty row."""
    m = to_numpy(mask).astype(bool)
    if m.ndim != 2:
        raise NotSupported(f"a mask of rank {m.ndim} (a [batch, time] mask is modelled)")
    lens = m.sum(axis=1)
    if not np.array_equal(m, np.arange(m.shape[1])[None, :] < lens[:, None]):
        raise NotSupported("a mask that is not right padding (ONNX sequence_lens)")
    if (lens == 0).any():
        raise NotSupported("a fully masked sequence (sequence_lens 0)")
    if (
        layer.zero_output_for_mask
        and not layer.return_sequences
        and not layer.go_backwards
        and not bool(m[:, -1].all())
    ):
        raise NotSupported("zero_output_for_mask with return_sequences=False on padded rows")


def _record(
    w: Any,
    layer: Any,
    original: Callable[..., Any],
    region: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
) -> None:
    cell = layer.cell
    check_form(layer, bool(kwargs.get("training")))
    seq, init, mask = _call_args(args, kwargs)
    if mask is not None:
        check_mask(layer, mask)
    tensors = [seq, mask, *(init or [])]
    targs = [None if t is None else w.arg(t, region) for t in tensors]
    tainted = any(a is not None and a.ref in w.taint for a in targs)
    variables = {
        "kernel": cell.kernel,
        "recurrent_kernel": cell.recurrent_kernel,
        "bias": cell.bias if cell.use_bias else None,
    }
    params: list[Any] = []
    for v in variables.values():
        if v is None:
            params.append(None)
            continue
        path = w.listener._paths.get(id(v.value.handle))
        if path is None:
            raise NotSupported(f"{type(layer).__name__} weights outside the model")
        params.append(w.targ(v.value, ("p" if v.trainable else "b", path), False))
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    config: dict[str, Any] = {
        "units": int(cell.units),
        "go_backwards": bool(layer.go_backwards),
        "return_sequences": bool(layer.return_sequences),
        "return_state": bool(layer.return_state),
        "zero_output_for_mask": bool(layer.zero_output_for_mask),
        "activation": _activation_name(cell.activation),
    }
    if type(cell).__name__ == "GRUCell":
        config["reset_after"] = bool(cell.reset_after)
    index = w.record(
        _CELLS[type(cell).__name__],
        region,
        (targs[0], targs[1], tuple(targs[2:]), tuple(params)),
        tuple(sorted(config.items())),
        outs,
        len(outs),
        tainted,
        _LayerReplay(layer, original, mask is not None, init is not None),
    )
    w.model_refs.update(("o", index, k) for k in range(len(outs)))


class _LayerReplay:
    """The layer's own computation on the batch-dim replay's grown inputs
    (adapters/tensorflow/batch_dims.py), in inference. Keras' RNN.call draws its
    cell's dropout masks even in inference: the seed generators' states are put
    back afterwards, so the replay leaves the run's random numbers as they were."""

    def __init__(
        self, layer: Any, original: Callable[..., Any], masked: bool, with_state: bool
    ) -> None:
        self.layer = layer
        self.original = original
        self.masked = masked
        self.with_state = with_state

    def __call__(self, seq: Any, mask: Any, states: tuple[Any, ...], params: Any) -> list[Any]:
        seeds = [v for v in self.layer.variables if "seed_generator" in str(v.path)]
        saved = [v.numpy() for v in seeds]
        try:
            out = self.original(
                seq,
                initial_state=list(states) if self.with_state else None,
                mask=mask if self.masked else None,
                training=False,
            )
        finally:
            for v, value in zip(seeds, saved, strict=True):
                v.assign(value)
        return list(out) if isinstance(out, (list, tuple)) else [out]
