"""The float64 reference of the sample batch: the recorded TensorFlow ops run
again through TensorFlow's own kernels in float64.

Every op of the tape is executed again (``tensorflow.python.eager.execute``,
with the attributes the op callback saw and every float32 type attribute
widened to float64) on the batch, the parameters and buffers as they were
when it began, constants and the dropout draws, all widened. The gradient of
each op is recorded as TensorFlow's generated op wrappers record it, so the
parameter gradients are TensorFlow's own gradient functions in float64. The
draws are the batch's own (nothing random runs again), and no variable of
the model is read or written: training is unchanged.

The reference differentiates the function the log records, which is what an
emitted program differentiates. Where TensorFlow's registered gradient of an
op is not the derivative of that op's output, the op is replayed as the
adapter rule writes it instead (``_AS_RECORDED``), through TensorFlow's
kernels of the rule's ops, so reference and program mean the same function.
One such op: ``SoftmaxCrossEntropyWithLogits``, whose gradient is
``softmax(logits) - labels``, the derivative of ``-sum(labels *
log_softmax(logits))`` only where each row of labels sums to 1. Keras' label
smoothing makes the labels in float32 (``y * 0.9 + 0.1 / 5``), whose rows sum
to 1 - 4.5e-8; the derivative is ``softmax(logits) * sum(labels) - labels``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tracelog.adapters.tape import Ref, Tape, TArg, concrete_shape

from .recurrent import _LayerReplay


class ReferenceUnavailable(Exception):
    """The replay could not run (an op with no float64 kernel); the sample
    then has no reference, and trace.json says why."""


def _widened_attrs(op_type: str, attrs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The callback's flat (name, value, ...) attrs with float32 type
    attributes (T, dtype, DstT, ...) made float64."""
    import tensorflow as tf
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op_type)
    if op_def is None:
        raise ReferenceUnavailable(f"no op definition for {op_type}")
    kinds = {a.name: a.type for a in op_def.attr}
    defaults = {a.name: _default_attr(a) for a in op_def.attr if a.HasField("default_value")}

    def widen(v: Any) -> Any:
        if isinstance(v, tf.DType):
            return tf.float64 if v == tf.float32 else v
        if isinstance(v, int) and v == tf.float32.as_datatype_enum:
            return tf.float64.as_datatype_enum
        return v

    out: list[Any] = []
    for name, value in zip(attrs[0::2], attrs[1::2], strict=True):
        key = name.decode() if isinstance(name, bytes) else str(name)
        if value is None:
            # unset (Conv1D's and ConvLSTM's Conv2D use_cudnn_on_gpu): the op def's
            # default, which the kernel applies, given explicitly, since the op's
            # gradient function reads it (Conv2D's reads use_cudnn_on_gpu)
            value = defaults.get(key)
        if kinds.get(key) == "type":
            value = widen(value)
        elif kinds.get(key) == "list(type)" and isinstance(value, (list, tuple)):
            value = [widen(v) for v in value]
        if value is None and not str(kinds.get(key, "")).startswith("list"):
            continue  # unset, with no scalar default: the kernel's default applies
        out += [name, [] if value is None else value]
    return tuple(out)


def _default_attr(attr_def: Any) -> Any:
    """An op def attribute's scalar default as execute takes it (None for a
    list, tensor or shape default: left unset, as the callback saw it)."""
    value = attr_def.default_value
    kind = value.WhichOneof("value")
    if kind in ("b", "i", "f", "s", "type"):
        return getattr(value, kind)
    return None


def _softmax_xent(inputs: list[Any]) -> list[Any]:
    """``SoftmaxCrossEntropyWithLogits`` as rules.py's ``_xent`` records it:
    ``-sum(labels * log_softmax(logits), -1)``, differentiated as written; its
    second output is the kernel's ``softmax(logits) - labels``."""
    import tensorflow as tf

    logits, labels = inputs
    loss = tf.negative(tf.reduce_sum(labels * tf.nn.log_softmax(logits, axis=-1), axis=-1))
    return [loss, tf.nn.softmax(logits, axis=-1) - labels]


def _conv2d_by_groups(inputs: list[Any], attrs: tuple[Any, ...]) -> list[Any] | None:
    """A grouped ``Conv2D`` (the filter reads fewer channels than the input
    has: Keras ``Conv2D(groups=...)``, ConvNeXt's depthwise convolutions) as
    the same convolution per group, concatenated: TensorFlow's CPU has no
    float64 grouped kernel. None for an ungrouped one."""
    import tensorflow as tf

    x, w = inputs
    a = {
        (k.decode() if isinstance(k, bytes) else str(k)): v
        for k, v in zip(attrs[0::2], attrs[1::2], strict=True)
    }
    fmt = a["data_format"].decode() if isinstance(a["data_format"], bytes) else a["data_format"]
    axis = 3 if fmt == "NHWC" else 1
    groups = int(x.shape[axis]) // int(w.shape[2])
    if groups <= 1:
        return None
    padding = a["padding"].decode() if isinstance(a["padding"], bytes) else a["padding"]
    if padding == "EXPLICIT":
        flat = list(a["explicit_paddings"])
        padding = [flat[i : i + 2] for i in range(0, len(flat), 2)]
    outs = [
        tf.nn.conv2d(xg, wg, a["strides"], padding, data_format=fmt, dilations=a["dilations"])
        for xg, wg in zip(tf.split(x, groups, axis=axis), tf.split(w, groups, axis=3), strict=True)
    ]
    return [tf.concat(outs, axis=axis)]


def _dilated_filter(w: Any, rates: list[int]) -> Any:
    """A [kh, kw, ...] filter with rate-1 zeros between its taps on the two
    spatial axes: a convolution with it at dilation 1 is the dilated one."""
    import tensorflow as tf

    for axis, rate in enumerate(rates):
        if rate > 1:
            taps = int(w.shape[axis])
            zeros = tf.zeros_like(w)
            spread = tf.stack([w, *[zeros] * (rate - 1)], axis=axis + 1)
            shape = [int(d) for d in w.shape]
            shape[axis] = taps * rate
            w = tf.reshape(spread, shape)
            w = tf.gather(w, tf.range((taps - 1) * rate + 1), axis=axis)
    return w


def _backprop_input_undilated(inputs: list[Any], attrs: tuple[Any, ...]) -> list[Any] | None:
    """A dilated ``Conv2DBackpropInput`` (Keras ``Conv2DTranspose`` with a
    dilation rate) run at dilation 1 on the filter with zeros between its
    taps, the same sums: TensorFlow's CPU has no float64 dilated kernel. None
    for an undilated one."""
    import tensorflow as tf

    names = [k.decode() if isinstance(k, bytes) else str(k) for k in attrs[0::2]]
    a = dict(zip(names, attrs[1::2], strict=True))
    fmt = a["data_format"].decode() if isinstance(a["data_format"], bytes) else a["data_format"]
    spatial = [1, 2] if fmt == "NHWC" else [2, 3]
    rates = [int(a["dilations"][i]) for i in spatial]
    if max(rates) <= 1:
        return None
    sizes, w, dy = inputs
    padding = a["padding"].decode() if isinstance(a["padding"], bytes) else a["padding"]
    if padding == "EXPLICIT":
        flat = list(a["explicit_paddings"])
        padding = [flat[i : i + 2] for i in range(0, len(flat), 2)]
    # the public op, so that the replay's tape differentiates it
    out = tf.nn.conv2d_transpose(
        dy, _dilated_filter(w, rates), sizes, a["strides"], padding, data_format=fmt
    )
    return [out]


# op type -> its replay as the adapter rule writes it (the module docstring says why)
_AS_RECORDED: dict[str, Callable[[list[Any]], list[Any]]] = {
    "SoftmaxCrossEntropyWithLogits": _softmax_xent,
}


class _Replay:
    """The widened values of the tape's refs, and each record run again."""

    def __init__(self, tape: Tape) -> None:
        import tensorflow as tf
        from tensorflow.python.eager import context, execute

        self.tf, self.execute, self.ctx = tf, execute, context.context()
        self.batch = int(tape.batch_size or 0)
        self.values: dict[Ref, Any] = {}

    def wide(self, t: Any) -> Any:
        tf = self.tf
        t = tf.convert_to_tensor(t)
        return tf.cast(t, tf.float64) if t.dtype in (tf.float32, tf.float16, tf.bfloat16) else t

    def value_of(self, a: TArg) -> Any:
        found = self.values.get(a.ref)
        if found is not None:
            return found
        if a.ref[0] == "n":  # the batch size (times a.ref[3]) as a number
            k = int(a.ref[3]) if len(a.ref) > 3 else 1
            shape = concrete_shape(a.shape, self.batch)
            return self.wide(self.tf.cast(self.tf.fill(shape, float(self.batch * k)), a.dtype))
        raise ReferenceUnavailable(f"no value for a {a.ref[0]!r} ref")

    def run(self, rec: Any) -> None:
        if isinstance(rec.func, _LayerReplay):
            outs = _recurrent64(rec.func.layer, *self._layer_args(rec))
            for k, t in enumerate(outs):
                self.values[("o", rec.index, k)] = t
            return
        if not isinstance(rec.func, tuple):
            raise ReferenceUnavailable(f"{rec.op} has no float64 replay")
        op_type, attrs = rec.func
        inputs = [self.value_of(a) for a in rec.args]
        as_recorded = _AS_RECORDED.get(op_type)
        if as_recorded is not None:
            for k, t in enumerate(as_recorded(inputs)):
                self.values[("o", rec.index, k)] = t
            return
        attrs = _widened_attrs(op_type, attrs)
        rewritten = _conv2d_by_groups(inputs, attrs) if op_type == "Conv2D" else None
        if op_type == "Conv2DBackpropInput":
            rewritten = _backprop_input_undilated(inputs, attrs)
        if rewritten is not None:
            self.values[("o", rec.index, 0)] = rewritten[0]
            return
        try:
            outs = self.execute.execute(op_type, len(rec.outs), inputs, attrs, self.ctx)
        except Exception as e:  # an op with no float64 kernel
            first = str(e).splitlines()[0][:120] if str(e) else ""
            raise ReferenceUnavailable(f"{op_type} in float64: {first}") from None
        # as TensorFlow's generated op wrappers do: the tape can differentiate it
        self.execute.record_gradient(op_type, inputs, attrs, outs)
        for k, t in enumerate(outs):
            self.values[("o", rec.index, k)] = t

    def _layer_args(self, rec: Any) -> tuple[Any, Any, list[Any], list[Any]]:
        """A recurrent record's (sequence, mask or None, initial states, weights
        (kernel, recurrent_kernel, bias or None)), widened (recurrent.py `_record`)."""
        seq, mask, states, weights = rec.args
        return (
            self.value_of(seq),
            None if mask is None else self.value_of(mask),
            [self.value_of(a) for a in states],
            [None if a is None else self.value_of(a) for a in weights],
        )


def _float64_config(config: dict[str, Any]) -> dict[str, Any]:
    """A layer's or cell's config in float64, seeded, its initializers zeros:
    its copy draws no random number (its weights are set before it runs)."""
    out = {**config, "dtype": "float64", "seed": 0}
    for key in ("kernel_initializer", "recurrent_initializer", "bias_initializer"):
        if key in out:
            out[key] = "zeros"
    return out


def _recurrent64(
    layer: Any, seq: Any, mask: Any, states: list[Any], weights: list[Any]
) -> list[Any]:
    """A Keras LSTM / GRU / SimpleRNN (or RNN of their cell) recorded whole, in
    float64: a copy of the layer made from its config in float64 (its own code:
    masks, go_backwards, return_sequences and states as the layer has them),
    called with its kernel, recurrent kernel and bias read as the given tensors
    (keras.StatelessScope), so the gradient reaches them. The copy takes the
    layer's name and draws no random number: training is unchanged."""
    import random

    import keras

    config = dict(layer.get_config())
    cell = config.get("cell")
    if isinstance(cell, dict) and isinstance(cell.get("config"), dict):  # RNN(cell)
        config = {**config, "dtype": "float64", "cell": {**cell}}
        config["cell"]["config"] = _float64_config(cell["config"])
    else:
        config = _float64_config(config)
    state = random.getstate()
    try:
        copy = type(layer).from_config(config)
        copy.build(tuple(seq.shape))
    finally:
        random.setstate(state)
    variables = (copy.cell.kernel, copy.cell.recurrent_kernel, getattr(copy.cell, "bias", None))
    mapping = [(v, t) for v, t in zip(variables, weights, strict=True) if t is not None]
    with keras.StatelessScope(state_mapping=mapping):
        out = copy(seq, initial_state=list(states) or None, mask=mask, training=False)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def reference64(
    tape: Tape,
    *,
    sources: Mapping[Ref, Any],
    params: Mapping[str, np.ndarray],
    buffers: Mapping[str, np.ndarray],
    trainable: list[str],
) -> dict[str, Any]:
    """The tape in float64: {"outputs": {role: array}, "loss", "grads": {path},
    "updates": {path}, "loss_scale": sum |p * dloss/dp| over the predictions}. ``sources`` holds the tensors behind the tape's refs
    that are not op outputs (data, targets, constants, draws); ``params`` and
    ``buffers`` the variables' values when the batch began."""
    if tape.loss is None:
        raise ReferenceUnavailable("the batch has no loss")
    replay = _Replay(tape)
    tf, values = replay.tf, replay.values
    leaves = {path: replay.wide(a) for path, a in params.items()}
    values.update((("p", path), t) for path, t in leaves.items())
    values.update((("b", path), replay.wide(a)) for path, a in buffers.items())
    values.update((ref, replay.wide(t)) for ref, t in sources.items() if ref[0] in "itcr")
    names = [p for p in trainable if p in leaves]
    with tf.GradientTape(watch_accessed_variables=False) as grad_tape:
        for path in names:
            grad_tape.watch(leaves[path])
        for rec in tape.recs:
            replay.run(rec)
        loss = values[tape.loss]
    predictions = [values[ref] for _, ref in tape.outputs]
    found = grad_tape.gradient(loss, [leaves[p] for p in names] + predictions)
    by_prediction = found[len(names) :]
    found = found[: len(names)]

    def as_array(t: Any) -> np.ndarray:
        return np.array(tf.convert_to_tensor(t).numpy())

    return {
        "outputs": {role: as_array(values[ref]) for role, ref in tape.outputs},
        "loss": as_array(loss),
        "grads": {p: as_array(g) for p, g in zip(names, found, strict=True) if g is not None},
        "updates": {path: as_array(values[ref]) for path, ref in tape.buffer_updates},
        "loss_scale": sum(  # tracelog.sample.scale_key
            float(np.abs(as_array(p) * as_array(g)).sum())
            for p, g in zip(predictions, by_prediction, strict=True)
            if g is not None and p.dtype.is_floating
        ),
    }
