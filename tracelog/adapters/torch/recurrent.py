"""Recurrent layers seen as one call each.

On the CPU the dispatcher never shows a GRU or an RNN whole: ``aten.gru.input`` and its
kin are CompositeImplicitAutograd, so they arrive as hundreds of per-time-step ops, and
nn.LSTM arrives as one ``mkldnn_rnn_layer`` per layer and direction. What every device
shares is the Python call the layer makes: ``torch._VF.lstm`` / ``gru`` / ``rnn_tanh`` /
``rnn_relu``, which honours ``__torch_function__``. ``RecurrentCalls``, a TorchFunctionMode,
sees that call and has the window record it as one record, named by the aten overload
the call is (``aten.gru.input``), while the dispatch mode records nothing of the ops
inside it (``InnerOps``) except the keep masks of the dropout between layers, which it
keeps for the sample: one ``MASK_OP`` record per mask after the call's record.

A TorchFunctionMode on the mode stack changes what some modules run: the fast paths of
nn.MultiheadAttention and nn.TransformerEncoderLayer (inference) are refused when
``has_torch_function`` is true, and it costs every torch function call a trip through
Python. So the mode is pushed only while a recurrent layer's forward runs (nn.RNNBase:
nn.LSTM, nn.GRU, nn.RNN; leaves, without such fast paths). A recurrent call made from
another module is seen op by op, as before.

Over a PackedSequence (``pack_padded_sequence`` -> the layer -> ``pad_packed_sequence``)
the packing is one aten op (``_pack_padded_sequence``), the layer's call is the ``.data``
overload, and ``_pad_packed_sequence``, which the dispatcher shows only as a loop of
slices and copies over the batch sizes (the data's), is recorded whole too: ``torch._VF``'s
attribute is wrapped once per process (``wrap_pad_packed``), and the wrapper records the
call as one record while an exact window's recorder is on the dispatch stack (outside
one it only forwards the call). rules_recurrent.py turns the three into one ONNX
recurrent node with ``sequence_lens``.

Nothing here perturbs training: the call runs as it would (same arguments, same RNG
draws); the record is taken from its arguments and results.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from tracelog.adapters.tape import TArg

from .rules_recurrent import MASK_OP, made_by_zeros

_VF = torch._C._VariableFunctions
_aten = torch.ops.aten
# the call -> the aten overloads it is: over a padded tensor, over a PackedSequence
_CALLS: dict[Any, tuple[Any, Any]] = {
    _VF.lstm: (_aten.lstm.input, _aten.lstm.data),
    _VF.gru: (_aten.gru.input, _aten.gru.data),
    _VF.rnn_tanh: (_aten.rnn_tanh.input, _aten.rnn_tanh.data),
    _VF.rnn_relu: (_aten.rnn_relu.input, _aten.rnn_relu.data),
}


class InnerOps:
    """The dispatcher's ops inside one recorded call: only the dropout masks are kept."""

    def __init__(self) -> None:
        self.masks: list[tuple[torch.Tensor, float]] = []  # (mask, keep probability)

    def saw(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # CPU dropout between layers: empty_like -> bernoulli_(keep) -> div_ -> mul; the
        # tensor bernoulli_ fills is the mask (scaled by div_ later: nonzero where kept)
        if func is _aten.bernoulli_.float:
            keep = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            self.masks.append((args[0], float(keep)))


class RecurrentCalls(TorchFunctionMode):
    """Records each recurrent call of a batch window as one record (see the module doc)."""

    def __init__(self, window: Any) -> None:
        super().__init__()
        self.window = window

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        w = self.window
        try:
            overloads = _CALLS.get(func)
        except TypeError:  # an unhashable callable: not one of ours
            overloads = None
        if overloads is None or not w.recording or w.call is not None or len(args) < 3:
            return func(*args, **kwargs)
        inner = InnerOps()
        w.call = inner
        try:
            out = func(*args, **kwargs)
        finally:
            w.call = None
        w.guarded(_record_call, w, func is _VF.lstm, overloads, args, kwargs, out, inner)
        return out


def _record_call(
    w: Any,
    lstm: bool,
    overloads: tuple[Any, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
    inner: InnerOps,
) -> None:
    # the packed form passes batch_sizes (a tensor) before the state and the parameters
    packed = isinstance(args[1] if lstm else args[2], torch.Tensor)
    overload = overloads[1] if packed else overloads[0]
    index = len(w.tape.recs)
    w.on_op(overload, args, kwargs, out)
    if len(w.tape.recs) == index or packed:
        return  # not recorded (outside the forward), or recorded as unsupported
    rec = w.tape.recs[index]
    states = (rec.args[1],) if isinstance(rec.args[1], TArg) else rec.args[1]  # LSTM: (h, c)
    zero = tuple(made_by_zeros(w.tape.recs, s.ref) for s in states)
    rec.func = _CallReplay(overload, zero)
    batch_first = bool(args[8])
    y = w.arg(out[0], rec.region)
    for mask, keep in inner.masks:
        w.record(
            MASK_OP, rec.region, (y, batch_first, keep), (), [mask], 1, rec.tainted, _mask_replay
        )


class _CallReplay:
    """The call replayed on meta tensors (the batch-dim replay, adapters/torch/batch_dims.py)
    or in float64 (reference.py, where no dropout was drawn): without dropout (no
    generator is touched), and with a state torch made with zeros remade at the
    replayed batch size, as the layer would have made it."""

    def __init__(self, overload: Any, zero: tuple[bool, ...]) -> None:
        self.overload = overload
        self.zero = zero

    def __call__(self, x: torch.Tensor, hx: Any, params: Any, *flags: Any) -> Any:
        biased, layers, _dropout, _train, bidirectional, batch_first = flags
        batch = x.shape[0 if batch_first else 1]
        states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        states = [
            s.new_zeros(s.shape[0], batch, s.shape[2]) if zero else s
            for s, zero in zip(states, self.zero, strict=True)
        ]
        if x.dim() != 3 or x.shape[-1] != params[0].shape[1]:
            # the kernels check no shapes on meta tensors (a wrong replay choice crashed)
            raise ValueError(f"input {tuple(x.shape)} does not fit the layer's weights")
        hidden = params[1].shape[1]  # W_hh: [gates * hidden, hidden (or proj_size)]
        want = (layers * (2 if bidirectional else 1), batch)
        if any(s.dim() != 3 or tuple(s.shape[:2]) != want for s in states) or any(
            s.shape[2] != hidden for s in states[:1]
        ):
            raise ValueError("the state does not fit the input and the layer")
        state = states if isinstance(hx, (list, tuple)) else states[0]
        return self.overload(
            x, state, params, biased, layers, 0.0, False, bidirectional, batch_first
        )


def _mask_replay(y: torch.Tensor, batch_first: bool, keep: float) -> torch.Tensor:
    """A mask record on meta tensors: the layer output's shape, sequence first."""
    return torch.empty_like(y.transpose(0, 1) if batch_first else y)


class RecurrentScopes:
    """A RecurrentCalls pushed for the current exact window while each recurrent
    layer's forward runs. The listener's module hooks call ``enter`` and ``exit`` (one pre and
    one post hook per module, not two more of each: a hook's call is most of what a
    fast window costs); the post hook always runs, so the mode stack stays balanced."""

    def __init__(self) -> None:
        self.pushed: list[RecurrentCalls | None] = []

    def enter(self, w: Any) -> None:
        """A recurrent layer's forward starts; ``w``: the exact window, else None."""
        mode = None
        if w is not None and w.recording:
            mode = RecurrentCalls(w)
            mode.__enter__()
        self.pushed.append(mode)

    def exit(self) -> None:
        mode = self.pushed.pop() if self.pushed else None
        if mode is not None:
            mode.__exit__(None, None, None)


_PAD_PACKED = "_pad_packed_sequence"
_WRAPPED_PAD: list[Callable[..., Any]] = []  # torch's own function, once wrapped


def wrap_pad_packed(window_of: Callable[[Any], Any]) -> None:
    """Wrap ``torch._VF._pad_packed_sequence`` (what ``pad_packed_sequence`` calls)
    once per process: in an exact window (``window_of`` reads it from a dispatch
    mode, None for other modes) the call is recorded as one record
    ``aten._pad_packed_sequence.default``; anywhere else it is only forwarded."""
    if _WRAPPED_PAD:
        return
    run = getattr(torch._VF, _PAD_PACKED)
    _WRAPPED_PAD.append(run)

    @functools.wraps(run)
    def pad_packed(*args: Any, **kwargs: Any) -> Any:
        w = None
        for mode in _get_current_dispatch_mode_stack():
            w = window_of(mode)
            if w is not None:
                break
        if w is None or not w.recording or w.call is not None:
            return run(*args, **kwargs)
        inner = InnerOps()  # its slices and copies: not recorded
        w.call = inner
        try:
            out = run(*args, **kwargs)
        finally:
            w.call = None
        w.guarded(w.on_op, _aten._pad_packed_sequence.default, args, kwargs, out)
        return out

    # torch._VF is a module whose __getattr__ forwards to the C functions: an
    # attribute set on it is found first (nn.utils.rnn looks it up per call)
    setattr(torch._VF, _PAD_PACKED, pad_packed)
