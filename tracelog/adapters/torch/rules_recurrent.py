"""Recurrent layers in the aten table.

The listener records one torch._VF call of a recurrent layer (nn.LSTM, nn.GRU, nn.RNN) as
one record, named by the aten overload the call is (aten.lstm.input, aten.gru.input,
aten.rnn_tanh.input, aten.rnn_relu.input; see tracelog.adapters.torch.recurrent). Each
becomes one ONNX LSTM / GRU / RNN node per layer, both directions of a layer in one node
(direction="bidirectional"), with a Dropout between layers where training drew one. The
time loop stays inside the node: the graph's size does not depend on the sequence length.

Torch keeps, per layer and direction, w_ih [gates*H, in], w_hh [gates*H, H], b_ih and b_hh
in its gate order; ONNX wants W, R [dirs, gates*H, ...] and B [dirs, 2*gates*H] (Wb then
Rb) in its own. The conversion is written as IR ops on the parameters (Split, Concat,
Reshape), so gradients reach the torch parameters by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracelog.adapters.builder import Ctx, NotSupported
from tracelog.adapters.tape import Rec, Ref, TArg
from tracelog.adapters.torch.rules import ATEN, Names
from tracelog.ir import TensorType

# One keep mask an inter-layer dropout drew inside a recorded call. The listener records
# one such record per mask right after the call's record, with arguments (the call's
# output, batch_first, keep probability); the call's rule takes the sample's masks from them.
MASK_OP = "tracelog.recurrent_dropout.mask"

# a state made by one of these is ONNX's default state (zeros): left out of the node
_ZEROS = ("aten.zeros.default", "aten.new_zeros.default", "aten.zeros_like.default")
_SAME = ("aten.detach.default", "aten.alias.default", "aten.clone.default")


def made_by_zeros(recs: Sequence[Rec], ref: Ref) -> bool:
    """Whether a tensor is zeros made in the batch (through copies and detaches)."""
    while ref[0] == "o":
        rec = recs[ref[1]]
        if rec.op in _ZEROS:
            return True
        if rec.op not in _SAME or not isinstance(rec.args[0], TArg):
            return False
        ref = rec.args[0].ref
    return False


@dataclass(frozen=True)
class _Kind:
    op: str  # the ONNX op
    gates: int
    order: tuple[int, ...]  # ONNX's k-th gate is torch's gate order[k]
    attrs: dict[str, Any] = field(default_factory=dict)
    activation: str = ""  # RNN: ONNX's name of the activation, per direction


_KINDS = {
    # torch i, f, g, o -> ONNX i, o, f, c
    "aten.lstm.input": _Kind("LSTM", 4, (0, 3, 1, 2)),
    # torch r, z, n -> ONNX z, r, h; torch applies the reset gate after the recurrent matmul
    "aten.gru.input": _Kind("GRU", 3, (1, 0, 2), {"linear_before_reset": 1}),
    "aten.rnn_tanh.input": _Kind("RNN", 1, (0,)),
    "aten.rnn_relu.input": _Kind("RNN", 1, (0,), activation="Relu"),
}


@dataclass(frozen=True)
class _Call:
    """The arguments of one recorded call, as the rule reads them."""

    kind: _Kind
    params: tuple[TArg, ...]
    layers: int
    dirs: int
    hidden: int
    biased: bool
    batch_first: bool
    dropout: float  # between layers, in training; 0 otherwise

    def weights(self, layer: int, k: int) -> list[TArg]:
        """Parameter k of each direction of a layer (w_ih, w_hh, b_ih, b_hh)."""
        per = 4 if self.biased else 2
        return [self.params[(layer * self.dirs + d) * per + k] for d in range(self.dirs)]


def _call(ctx: Ctx, packed: bool = False) -> _Call:
    """The call's arguments: ``.input`` (input, hx, params, has_biases, num_layers,
    dropout, train, bidirectional, batch_first), or ``.data`` over a packed sequence
    (data, batch_sizes, then the same up to bidirectional; batch_first is the packing's)."""
    at = 1 if packed else 0  # .data passes batch_sizes second
    kind = _KINDS[ctx.rec.op.replace(".data", ".input")]
    params = tuple(ctx.arg(2 + at, "params"))
    biased, layers = bool(ctx.arg(3 + at)), int(ctx.arg(4 + at))
    dropout, train, bidirectional = (
        float(ctx.arg(5 + at)),
        bool(ctx.arg(6 + at)),
        bool(ctx.arg(7 + at)),
    )
    dirs = 2 if bidirectional else 1
    if len(params) != layers * dirs * (4 if biased else 2):
        raise NotSupported(f"{kind.op} with projections (proj_size)")
    hidden = int(params[1].shape[1])  # w_hh: [gates * hidden, hidden]
    return _Call(
        kind,
        params,
        layers,
        dirs,
        hidden,
        biased,
        False if packed else bool(ctx.arg(8)),
        dropout if train and layers > 1 else 0.0,
    )


def _gates(ctx: Ctx, c: _Call, t: TArg) -> list[str]:
    """A torch weight or bias cut into its gates, in ONNX's gate order."""
    name = ctx.b.name_of(t)
    if c.kind.gates == 1:
        return [name]
    part = TensorType(t.dtype, (c.hidden, *t.shape[1:]))
    parts = ctx.node(
        "Split", [name, ctx.ints([c.hidden] * c.kind.gates)], outs=[part] * c.kind.gates, axis=0
    )
    return [parts[k] for k in c.kind.order]


def _stacked(ctx: Ctx, c: _Call, tensors: Sequence[TArg]) -> str:
    """ONNX's [dirs, rows, ...] from torch's tensors of each direction in turn (for B, b_ih
    then b_hh): gates reordered, concatenated, one row block per direction."""
    pieces = [p for t in tensors for p in _gates(ctx, c, t)]
    first = tensors[0]
    rows = sum(int(t.shape[0]) for t in tensors)
    rest = tuple(int(d) for d in first.shape[1:])
    flat = pieces[0]
    if len(pieces) > 1:
        flat = ctx.helper("Concat", pieces, TensorType(first.dtype, (rows, *rest)), axis=0)
    shape = (c.dirs, rows // c.dirs, *rest)
    return ctx.helper("Reshape", [flat, ctx.ints(shape)], TensorType(first.dtype, shape))


def _states(ctx: Ctx, c: _Call, state: TArg) -> list[str]:
    """Torch's initial state [layers * dirs, batch, hidden] as one [dirs, batch, hidden]
    per layer; none where torch made it with zeros (ONNX's default)."""
    if made_by_zeros(ctx.b.tape.recs, state.ref):
        return [""] * c.layers
    name = ctx.b.name_of(state)
    if c.layers == 1:
        return [name]
    part = TensorType(state.dtype, (c.dirs, *state.shape[1:]))
    return ctx.node("Split", [name, ctx.ints([c.dirs] * c.layers)], outs=[part] * c.layers, axis=0)


def _mask_records(ctx: Ctx, c: _Call) -> list[int]:
    """The records of the keep masks this call drew, one per gap between layers."""
    recs = ctx.b.tape.recs
    found = []
    k = ctx.rec.index + 1
    while k < len(recs) and recs[k].op == MASK_OP:
        found.append(k)
        k += 1
    want = c.layers - 1 if c.dropout > 0 else 0
    if len(found) != want:
        raise NotSupported(
            f"{c.kind.op} drew {len(found)} dropout masks where {want} were expected "
            "(dropout inside a fused kernel is not seen)"
        )
    for k in found:
        keep = float(recs[k].args[2])
        if abs(keep - (1.0 - c.dropout)) > 1e-12:
            raise NotSupported(f"{c.kind.op} dropout mask drawn with keep {keep}")
    return found


def _layer_output(ctx: Ctx, c: _Call, y: str, seq: int | str, batch: int | str, dt: str) -> str:
    """ONNX's Y [seq, dirs, batch, hidden] as torch's [seq, batch, dirs * hidden]."""
    out = TensorType(dt, (seq, batch, c.dirs * c.hidden))
    if c.dirs == 1:
        return ctx.helper("Squeeze", [y, ctx.ints([1])], out)
    paired = ctx.helper(
        "Transpose", [y], TensorType(dt, (seq, batch, c.dirs, c.hidden)), perm=[0, 2, 1, 3]
    )
    return ctx.helper("Reshape", [paired, ctx.shape_const(list(out.shape))], out)


def _dropout(ctx: Ctx, x: str, ty: TensorType, ratio: float, mask_rec: int) -> str:
    """Dropout in training mode on a value of type ty (Ctx.dropout types it as the
    record's output, which a layer's output is not)."""
    y, _mask = ctx.node(
        "Dropout",
        [x, ctx.const(ratio, ty.dtype), ctx.const(True, "bool")],
        outs=[ty, TensorType("bool", ty.shape)],
    )
    ctx.b.random_recs[y] = mask_rec
    return y


@ATEN.register(*_KINDS)
def _recurrent(ctx: Ctx) -> Names:
    c = _call(ctx)
    xt = ctx.in_type(0)
    output, states = _layers(
        ctx, c, ctx.t(0), xt, c.batch_first, ctx.arg(1), "", _mask_records(ctx, c)
    )
    if c.batch_first:
        output = ctx.one("Transpose", [output], perm=[1, 0, 2])[0]
    return [output, *states]


def _layers(
    ctx: Ctx,
    c: _Call,
    x: str,
    xt: TensorType,
    batch_first: bool,
    hx: Any,
    lens: str,
    masks: list[int],
) -> tuple[str, list[str]]:
    """One ONNX node per layer over x (batch_first or sequence-first), each row
    `lens` steps long where given (ONNX sequence_lens, int32; its outputs zero
    from there on): the last layer's output sequence-first [seq, batch, dirs *
    hidden], and the final states as torch returns them."""
    dt = xt.dtype
    batch, seq = (xt.shape[0], xt.shape[1]) if batch_first else (xt.shape[1], xt.shape[0])
    if batch_first:  # the nodes run sequence-first (layout=0: what every runtime takes)
        x = ctx.helper("Transpose", [x], TensorType(dt, (seq, batch, xt.shape[2])), perm=[1, 0, 2])
    initial = [_states(ctx, c, s) for s in ((hx,) if isinstance(hx, TArg) else hx)]
    finals: list[list[str]] = [[] for _ in initial]  # per state: each layer's last state
    state = TensorType(dt, (c.dirs, batch, c.hidden))
    for layer in range(c.layers):
        w, r = _stacked(ctx, c, c.weights(layer, 0)), _stacked(ctx, c, c.weights(layer, 1))
        b = ""
        if c.biased:
            b_ih, b_hh = c.weights(layer, 2), c.weights(layer, 3)
            b = _stacked(ctx, c, [t for pair in zip(b_ih, b_hh, strict=True) for t in pair])
        inputs = [x, w, r, b, lens, *(s[layer] for s in initial)]
        while inputs[-1] == "":
            inputs.pop()
        attrs: dict[str, Any] = dict(c.kind.attrs)
        if c.kind.activation:
            attrs["activations"] = [c.kind.activation] * c.dirs
        y, *last = ctx.node(
            c.kind.op,
            inputs,
            outs=[TensorType(dt, (seq, c.dirs, batch, c.hidden))] + [state] * len(initial),
            hidden_size=c.hidden,
            direction="bidirectional" if c.dirs == 2 else "forward",
            **attrs,
        )
        for k, s in enumerate(last):
            finals[k].append(s)
        x = _layer_output(ctx, c, y, seq, batch, dt)
        if layer < len(masks):
            x = _dropout(
                ctx, x, TensorType(dt, (seq, batch, c.dirs * c.hidden)), c.dropout, masks[layer]
            )
    states = [
        s[0] if len(s) == 1 else ctx.node("Concat", s, outs=[ctx.rec.outs[k + 1]], axis=0)[0]
        for k, s in enumerate(finals)
    ]
    return x, states


# -- packed sequences: pack_padded_sequence -> the layer's .data call -> pad_packed_sequence
# The packed data (rows of every sequence's step t, for t = 0, 1, ...) has a size that
# depends on the lengths, so it is no value of the graph: the packing is noted (the
# padded input and its lengths), the layer runs over the padded input with ONNX's
# sequence_lens (each row's steps from its length on give zeros, its final state is the
# one at its length: torch's packed semantics, rows in the same order), and padding
# it back is that output. Anything else reading the packed data is not supported.
PACKED, PACKED_OUT, BATCH_SIZES = "packed", "packed output", "batch sizes"


@ATEN.register("aten._pack_padded_sequence.default")
def _pack(ctx: Ctx) -> Names:
    # (input, lengths [batch] int64, batch_first) -> (data, batch_sizes)
    data, sizes = ctx.b.helper_name(), ctx.b.helper_name()
    xt = ctx.in_type(0)
    if len(xt.shape) != 3:
        raise NotSupported(f"a packed sequence of rank {len(xt.shape)} (a recurrent layer takes 3)")
    ctx.b.pseudo[data] = (PACKED, ctx.t(0), xt, bool(ctx.arg(2, "batch_first")), _lens(ctx, 1))
    ctx.b.pseudo[sizes] = (BATCH_SIZES,)
    return [data, sizes]


def _lens(ctx: Ctx, i: int) -> tuple[str, str]:
    """The lengths (int64, as the source's) and as ONNX's sequence_lens (int32)."""
    lengths = ctx.t(i)
    lt = ctx.in_type(i)
    return lengths, ctx.helper("Cast", [lengths], TensorType("int32", lt.shape), to="int32")


def _packed(ctx: Ctx, i: int, kinds: tuple[str, ...]) -> tuple[Any, ...]:
    info = ctx.b.pseudo.get(ctx.raw_name(i))
    if info is None or info[0] not in kinds:
        raise NotSupported("a packed sequence's data not made by pack_padded_sequence here")
    return info


@ATEN.register(*(op.replace(".input", ".data") for op in _KINDS))
def _recurrent_packed(ctx: Ctx) -> Names:
    c = _call(ctx, packed=True)
    if c.dropout:
        # torch draws its masks over the packed rows, a layout the graph does not hold
        raise NotSupported(f"{c.kind.op} dropout between layers over a packed sequence")
    _kind, x, xt, batch_first, (lengths, lens) = _packed(ctx, 0, (PACKED,))
    output, states = _layers(ctx, c, x, xt, batch_first, ctx.arg(2), lens, [])
    data = ctx.b.helper_name()
    seq = xt.shape[1] if batch_first else xt.shape[0]
    ctx.b.pseudo[data] = (PACKED_OUT, output, ctx.b.values[output].type, seq, (lengths, lens))
    return [data, *states]


@ATEN.register("aten._pad_packed_sequence.default")
def _pad_packed(ctx: Ctx) -> Names:
    # (data, batch_sizes, batch_first, padding_value, total_length) -> (padded, lengths)
    info = _packed(ctx, 0, (PACKED, PACKED_OUT))
    if info[0] == PACKED:  # padded again as it was packed: the input, past each length zeroed
        _kind, x, xt, was_first, lengths = info
        if was_first:
            perm = [1, 0, *range(2, len(xt.shape))]
            x = ctx.helper(
                "Transpose", [x], TensorType(xt.dtype, tuple(xt.shape[i] for i in perm)), perm=perm
            )
        seq = xt.shape[1] if was_first else xt.shape[0]
        x = _past_lengths(ctx, x, seq, lengths[0], 0.0)
    else:
        _kind, x, _ty, seq, lengths = info
    batch_first = bool(ctx.arg(2, "batch_first"))
    value = float(ctx.arg(3, "padding_value", 0.0))
    out = ctx.out_type(0)
    steps = out.shape[1] if batch_first else out.shape[0]
    if value != 0.0:
        x = _past_lengths(ctx, x, seq, lengths[0], value)
    if steps != seq:
        # the longest length is the data's: the padded output is as long as the input
        # in every batch this graph stands for, or cut to a number of steps it recorded
        if not isinstance(steps, int) or not isinstance(seq, int) or steps > seq:
            raise NotSupported(f"padding a packed sequence of {seq} steps to {steps}")
        xt = ctx.b.values[x].type
        x = ctx.helper(
            "Slice",
            [x, ctx.ints([0]), ctx.ints([steps]), ctx.ints([0])],
            TensorType(xt.dtype, (steps, *xt.shape[1:])),
        )
    padded = (
        ctx.one("Transpose", [x], perm=[1, 0, 2])[0] if batch_first else ctx.one("Identity", [x])[0]
    )
    # the lengths, as the packing took them (its batch sizes count them back)
    counted = ctx.node("Identity", [lengths[0]], outs=[ctx.rec.outs[1]])[0]
    return [padded, counted]


def _past_lengths(ctx: Ctx, x: str, seq: int | str, lengths: str, value: float) -> str:
    """x [seq, batch, ...] with each row's steps from its length on set to value."""
    xt = ctx.b.values[x].type
    ones = ctx.helper(
        "ConstantOfShape",
        [ctx.shape_const([seq, 1], allow_minus_one=False)],
        TensorType("int64", (seq, 1)),
        value=1,
    )
    step = ctx.helper(
        "CumSum", [ones, ctx.const(0, "int64")], TensorType("int64", (seq, 1))
    )  # 1..seq
    batch = xt.shape[1]
    past = ctx.helper("Greater", [step, lengths], TensorType("bool", (seq, batch)))
    for axis in range(2, len(xt.shape)):
        past = ctx.helper(
            "Unsqueeze",
            [past, ctx.ints([axis])],
            TensorType("bool", (seq, batch, *[1] * (axis - 1))),
        )
    return ctx.helper("Where", [past, ctx.const(value, xt.dtype), x], xt)


@ATEN.register(MASK_OP)
def _recurrent_mask(ctx: Ctx) -> Names:
    return [None]  # read by the call's rule; no IR of its own


ATEN.not_yet(
    "aten.mkldnn_rnn_layer.default",
    reason=(
        "LSTM's per-layer CPU kernel, seen alone only where aten.lstm runs outside a "
        "torch._VF.lstm call in a leaf module (nn.LSTM's calls are recorded whole)"
    ),
)
