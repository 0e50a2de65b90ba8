"""Keras recurrent layers in the TF-op table.

The listener records a Keras LSTM, GRU or SimpleRNN call as one record (see
tracelog.adapters.tensorflow.recurrent), named ``keras.LSTM`` / ``keras.GRU`` /
``keras.SimpleRNN``, with arguments (sequence [batch, time, in], mask [batch, time] or
None, (initial states [batch, units] ...), (kernel, recurrent_kernel, bias or None)).
Each becomes one ONNX LSTM / GRU / RNN node (layout 0, direction forward, or reverse for
``go_backwards``); the time loop stays inside the node.

Keras keeps kernel [in, gates*units] and recurrent_kernel [units, gates*units] with the
gates side by side along the columns (LSTM i, f, c, o; GRU z, r, h), and one bias
(GRU with reset_after: [2, 3*units], the input bias then the recurrent one). ONNX wants
W [1, gates*units, in], R [1, gates*units, units] (LSTM gates i, o, f, c) and
B [1, 2*gates*units] (Wb then Rb). The conversion is IR ops on the parameters, so
gradients reach the Keras variables by path.

Masks (Keras, keras/src/backend/tensorflow/rnn.py): a masked step keeps the states and
outputs the previous step's output (zeros with ``zero_output_for_mask``, which a
Bidirectional sets when returning sequences). For a right-padded mask (checked when
recorded) that is ONNX's sequence_lens = the mask's row sums, with Keras' outputs
written from the node's: Y is zeros past each row's length, so ``Where(mask, Y, Y_h)``
repeats the last valid output. Backwards, Keras runs the reversed sequence from the
first valid step (the masked ones output zeros, the initial output) and returns its
outputs in the order it ran: ONNX's reverse direction, flipped in time.
"""

from __future__ import annotations

from typing import Any

from tracelog.adapters.builder import Ctx, NotSupported
from tracelog.adapters.tape import TArg
from tracelog.ir import TensorType

from .rules import TF_OPS, Names

# the record -> (ONNX op, gates, ONNX's k-th gate is Keras' gate order[k])
_KINDS: dict[str, tuple[str, int, tuple[int, ...]]] = {
    "keras.LSTM": ("LSTM", 4, (0, 3, 1, 2)),  # Keras i, f, c, o -> ONNX i, o, f, c
    "keras.GRU": ("GRU", 3, (0, 1, 2)),  # z, r, h in both
    "keras.SimpleRNN": ("RNN", 1, (0,)),
}
_BIG = 2**62


def _onnx_weight(ctx: Ctx, t: TArg, units: int, gates: int, order: tuple[int, ...]) -> str:
    """A Keras kernel [rows, gates*units] as ONNX's [1, gates*units, rows], gates reordered."""
    rows = int(t.shape[0])
    dt = t.dtype
    name = ctx.b.name_of(t)
    if order != tuple(range(gates)):
        part = TensorType(dt, (rows, units))
        parts = ctx.node("Split", [name, ctx.ints([units] * gates)], outs=[part] * gates, axis=1)
        name = ctx.helper(
            "Concat", [parts[k] for k in order], TensorType(dt, (rows, gates * units)), axis=1
        )
    flipped = ctx.helper("Transpose", [name], TensorType(dt, (gates * units, rows)), perm=[1, 0])
    shape = (1, gates * units, rows)
    return ctx.helper("Unsqueeze", [flipped, ctx.ints([0])], TensorType(dt, shape))


def _onnx_bias(ctx: Ctx, t: TArg, units: int, gates: int, order: tuple[int, ...]) -> str:
    """A Keras bias as ONNX's B [1, 2*gates*units]: [gates*units] is Wb (Rb zeros);
    GRU's reset_after [2, gates*units] is Wb then Rb already."""
    dt = t.dtype
    name = ctx.b.name_of(t)
    width = gates * units
    if len(t.shape) == 2:  # GRU reset_after: the input bias, then the recurrent one
        return ctx.helper(
            "Reshape", [name, ctx.ints([1, 2 * width])], TensorType(dt, (1, 2 * width))
        )
    if order != tuple(range(gates)):
        part = TensorType(dt, (units,))
        parts = ctx.node("Split", [name, ctx.ints([units] * gates)], outs=[part] * gates, axis=0)
        name = ctx.helper("Concat", [parts[k] for k in order], TensorType(dt, (width,)), axis=0)
    zeros = ctx.const([0.0] * width, dt)
    full = ctx.helper("Concat", [name, zeros], TensorType(dt, (2 * width,)), axis=0)
    return ctx.helper("Unsqueeze", [full, ctx.ints([0])], TensorType(dt, (1, 2 * width)))


def _reverse_time(ctx: Ctx, x: str, ty: TensorType, axis: int) -> str:
    return ctx.helper(
        "Slice", [x, ctx.ints([-1]), ctx.ints([-_BIG]), ctx.ints([axis]), ctx.ints([-1])], ty
    )


@TF_OPS.register(*_KINDS)
def _keras_recurrent(ctx: Ctx) -> Names:
    op, gates, order = _KINDS[ctx.rec.op]
    cfg = dict(ctx.rec.kwargs)
    units = int(cfg["units"])
    xt = ctx.in_type(0)
    dt = xt.dtype
    batch, seq, feat = xt.shape
    kernel, recurrent_kernel, bias = ctx.arg(3)
    states_in: tuple[TArg, ...] = ctx.arg(2)
    masked = isinstance(ctx.arg(1), TArg)

    x = ctx.helper("Transpose", [ctx.t(0)], TensorType(dt, (seq, batch, feat)), perm=[1, 0, 2])
    w = _onnx_weight(ctx, kernel, units, gates, order)
    r = _onnx_weight(ctx, recurrent_kernel, units, gates, order)
    b = "" if bias is None else _onnx_bias(ctx, bias, units, gates, order)
    lens = ""
    if masked:
        as_int = ctx.helper("Cast", [ctx.t(1)], TensorType("int32", (batch, seq)), to="int32")
        lens = ctx.helper(
            "ReduceSum", [as_int, ctx.ints([1])], TensorType("int32", (batch,)), keepdims=0
        )
    state = TensorType(dt, (1, batch, units))
    initial = []
    for s in states_in:
        name = ctx.b.name_of(s)
        if s.dtype != dt:
            raise NotSupported(f"an initial state of dtype {s.dtype} for a {dt} layer")
        initial.append(ctx.helper("Unsqueeze", [name, ctx.ints([0])], state))
    n_states = 2 if op == "LSTM" else 1
    if initial and len(initial) != n_states:
        raise NotSupported(f"{op} given {len(initial)} initial states")
    inputs = [x, w, r, b, lens, *initial]
    while inputs[-1] == "":
        inputs.pop()
    attrs: dict[str, Any] = {}
    if op == "GRU":
        attrs["linear_before_reset"] = int(bool(cfg.get("reset_after", True)))
    if op == "RNN":
        attrs["activations"] = [{"tanh": "Tanh", "relu": "Relu"}[str(cfg["activation"])]]
    backwards = bool(cfg["go_backwards"])
    y, *finals = ctx.node(
        op,
        inputs,
        outs=[TensorType(dt, (seq, 1, batch, units))] + [state] * n_states,
        hidden_size=units,
        direction="reverse" if backwards else "forward",
        **attrs,
    )
    last = [
        ctx.helper("Squeeze", [f, ctx.ints([0])], TensorType(dt, (batch, units))) for f in finals
    ]
    if cfg["return_sequences"]:
        ys = ctx.helper("Squeeze", [y, ctx.ints([1])], TensorType(dt, (seq, batch, units)))
        if backwards:  # Keras returns the reversed run in the order it ran
            ys = _reverse_time(ctx, ys, TensorType(dt, (seq, batch, units)), 0)
        out_ty = TensorType(dt, (batch, seq, units))
        output = ctx.helper("Transpose", [ys], out_ty, perm=[1, 0, 2])
        if masked and not backwards and not cfg["zero_output_for_mask"]:
            # a masked step repeats the last valid output; ONNX wrote zeros there
            keep = ctx.helper(
                "Unsqueeze", [ctx.t(1), ctx.ints([2])], TensorType("bool", (batch, seq, 1))
            )
            held = ctx.helper(
                "Unsqueeze", [last[0], ctx.ints([1])], TensorType(dt, (batch, 1, units))
            )
            output = ctx.helper("Where", [keep, output, held], out_ty)
    else:
        output = last[0]  # the last valid step's output is the final hidden state
    return [output, *last] if cfg["return_state"] else [output]
