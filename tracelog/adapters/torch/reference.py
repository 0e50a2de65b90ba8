"""The float64 reference of the sample batch: the recorded tape run again
through PyTorch's own kernels in float64.

Every float32 parameter, buffer, data input, target and constant is cast up,
each record's op (the same OpOverload the dispatcher ran; its definition where
the float64 kernel rounds a constant to float32: _DEFINITIONS) is called again
on those tensors, and the random draws are not drawn again: a ``bernoulli_``
mask is the one the batch drew. Autograd runs through the replay, so the
parameter gradients are torch's own backward formulas in float64. The model,
its tensors and the global RNG are never touched: training is unchanged.

The result is what a translation is checked against (``tracelog check``): a
program that computes the recorded function agrees with it to float64
rounding, whatever the model's float32 conditioning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from tracelog.adapters.tape import Ref, Tape, TArg

from .rules import VIEW_WRITE, WHOLE_VIEWS, inverse_order
from .rules_attention import TOPK, topk_args
from .rules_math import RRELU
from .rules_recurrent import MASK_OP
from .tensors import OUT_OF_PLACE_VIEWS, TORCH_DTYPES, flatten_tensors

# random ops replayed as the values the batch drew (a fresh bernoulli_ mask is 0/1
# until div_ scales it in place, so its nonzeros are the draw)
_DRAWS = {"aten.bernoulli_.float", "aten.bernoulli_.Tensor", "aten.bernoulli.default"}
_RANDOM = {
    "aten.uniform_.default",
    "aten.exponential_.default",
    "aten.normal_.default",
    "aten.rand_like.default",
    "aten.rand.default",
    "aten.randn.default",
    "aten.randn_like.default",
    "aten.randint.low",
    "aten.randint.default",
}
# a recurrent layer's whole call (adapters/torch/recurrent.py): with dropout between its
# layers, replayed a layer at a time with the keep masks its MASK_OP records kept
_RECURRENT = {
    "aten.lstm.input": torch.ops.aten.lstm.input,
    "aten.gru.input": torch.ops.aten.gru.input,
    "aten.rnn_tanh.input": torch.ops.aten.rnn_tanh.input,
    "aten.rnn_relu.input": torch.ops.aten.rnn_relu.input,
}


def _hardsigmoid(x: torch.Tensor, *_: Any) -> torch.Tensor:
    return torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


def _grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: Any = None,
) -> torch.Tensor:
    # torch._grouped_mm has no float64 kernel: each group's rows (offs: the groups'
    # cumulative ends) times its matrix, as its definition; rows past the last
    # offset, which the kernel leaves unwritten, are zeros
    if offs is None or a.dim() != 2 or b.dim() != 3 or bias is not None:
        raise ReferenceUnavailable("_grouped_mm other than 2-D rows by 3-D groups")
    parts, start = [], 0
    for g, end in enumerate(offs.tolist()):
        parts.append(a[start:end] @ b[g])
        start = end
    parts.append(a.new_zeros((a.shape[0] - start, b.shape[2])))
    return torch.cat(parts)


_HISTC = "aten.histc.default"


def _histc(rec: Any, args: list[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    """histc in float64 with the bin edges of the recorded dtype (torch's
    linspace in it, as the translation holds them): float64 edges would move
    a float32 value that sits on an edge (-0.4f) to the bin below."""
    x, bins = args[0], int(args[1] if len(args) > 1 else kwargs.get("bins", 100))
    lo = float(args[2] if len(args) > 2 else kwargs.get("min", 0))
    hi = float(args[3] if len(args) > 3 else kwargs.get("max", 0))
    if not lo < hi:
        return torch.histc(x, bins, lo, hi)
    edges = torch.linspace(lo, hi, bins + 1, dtype=TORCH_DTYPES[rec.outs[0].dtype])
    pos = (x.reshape(-1, 1) >= edges.to(x.dtype)).sum(1) - 1
    inside = (x.reshape(-1) >= lo) & (x.reshape(-1) <= hi)
    counted = pos.clamp(max=bins - 1)[inside]
    return torch.bincount(counted, minlength=bins).to(x.dtype)


# ops whose float64 kernel is not float64 throughout (or that have none:
# _grouped_mm), run by their definition instead: hardsigmoid's CPU backward
# multiplies by 1.0f / 6.0f, float32's 1/6 (0.1666666716), in float64 too (a
# 3e-8 error a translation would be blamed for)
_DEFINITIONS: dict[str, Callable[..., torch.Tensor]] = {
    "aten.hardsigmoid.default": _hardsigmoid,
    "aten.hardsigmoid_.default": _hardsigmoid,
    "aten._grouped_mm.default": _grouped_mm,
}


# uninitialised memory, replayed as NaN where floating: a translation reads an empty
# tensor's unwritten elements as zeros (rules.py, _written_base), and a source that
# read one would then disagree with the reference, never agree by chance
_EMPTY = {
    "aten.empty.memory_format",
    "aten.empty_like.default",
    "aten.new_empty.default",
    "aten.empty_strided.default",
    "aten.new_empty_strided.default",
}


class ReferenceUnavailable(Exception):
    """The replay could not run (an op with no float64 kernel, a record it does
    not know how to run again); the sample then has no reference."""


def _functional(rec: Any, args: list[Any]) -> Any:
    """The out-of-place twin of an in-place op that ran under no_grad (in a
    custom autograd Function's forward) and writes its first argument only
    (masked_fill_.Scalar: masked_fill.Scalar; it returns it, or the record
    lists it as mutated), where the replay's autograd tracks that argument
    (the Function's body is differentiated as recorded: _function_bodies), so
    a write in place would clobber what its backward saved; else None. The
    replay holds values, not storage (views replay as copies:
    OUT_OF_PLACE_VIEWS), so the twin's result stands for the written tensor
    from here on. A write with grad on stays in place: the batch's own
    autograd accepted it."""
    if rec.grad or rec.mutated not in ((), (0,)) or not args:
        return None
    if not isinstance(args[0], torch.Tensor):
        return None
    if not args[0].requires_grad or args[0].grad_fn is None:
        return None
    namespace, packet, overload = (rec.op.split(".") + [""])[:3]
    if namespace != "aten" or not packet.endswith("_") or packet.startswith("_"):
        return None
    twin = getattr(torch.ops.aten, packet[:-1], None)
    return None if twin is None else getattr(twin, overload or "default", None)


def _up(t: torch.Tensor) -> torch.Tensor:
    """A float64 copy of a floating tensor, a copy of any other: the replay may
    write in place, and must never write into the batch's own tensors."""
    t = t.detach()
    return t.to(torch.float64, copy=True) if t.is_floating_point() else t.clone()


class _Missing:
    """A record's output the replay could not compute, and why."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Replay:
    def __init__(
        self,
        sources: Mapping[Ref, torch.Tensor],
        drawn: Mapping[int, list[Any]],
        recs: list[Any],
        batch: int | None = None,
    ):
        self.values: dict[Ref, torch.Tensor] = dict(sources)
        self.drawn = drawn
        self.recs = recs
        self.batch = batch

    def value(self, ref: Ref) -> torch.Tensor:
        value = self.values.get(ref)
        if value is None and ref[0] == "n" and self.batch is not None:
            # the batch size (times ref[3]) as a number: WindowBase.constant
            k = int(ref[3]) if len(ref) > 3 else 1
            number = torch.full((1,) * int(ref[2]), self.batch * k, dtype=TORCH_DTYPES[ref[1]])
            value = self.values[ref] = _up(number)
        if value is None:
            raise ReferenceUnavailable(f"no value for {ref[0]!r} ref in the replay")
        if isinstance(value, _Missing):
            raise ReferenceUnavailable(value.reason)
        return value

    def lose(self, rec: Any, reason: str) -> None:
        """A record that could not run: its outputs are missing, which fails the
        reference only where a later record, an output or the loss reads one (a
        record whose values nothing reads, such as a dropout's write into a
        pooled tensor's base, costs nothing)."""
        for k in range(len(rec.outs)):
            self.values[("o", rec.index, k)] = _Missing(reason)  # type: ignore[assignment]

    def sub(self, obj: Any) -> Any:
        if isinstance(obj, TArg):
            return self.value(obj.ref)
        if isinstance(obj, tuple):
            return [self.sub(x) for x in obj]
        if obj in (torch.float32, torch.float16, torch.bfloat16):
            return torch.float64  # dtype= arguments: the whole replay is float64
        return obj

    def run(self, rec: Any) -> None:
        if not rec.grad:  # as the batch ran it: inside torch.no_grad(), no gradient through it
            with torch.no_grad():
                self._run(rec)
            return
        self._run(rec)

    def _run(self, rec: Any) -> None:
        if rec.op in _DRAWS or rec.op in _RANDOM:
            outs = self._drawn(rec)
        elif rec.op == VIEW_WRITE:
            outs = [self._view_write(rec)]
        elif rec.op == MASK_OP:
            outs = [self.drawn[rec.index][0].detach() != 0]  # read by the call before it
        elif rec.op == _HISTC:
            outs = [_histc(rec, [self.sub(a) for a in rec.args], dict(rec.kwargs))]
        elif rec.op == RRELU and rec.index in self.drawn:
            # RReLU in training: the slopes the batch drew (its noise), where x <= 0
            x, slopes = self.sub(rec.args[0]), _up(self.drawn[rec.index][0])
            outs = [torch.where(x > 0, x, x * slopes), slopes]
        elif rec.op == TOPK and rec.index in self.drawn:
            outs = self._unsorted_topk(rec)
        elif rec.op in _RECURRENT:
            outs = self._recurrent(rec)
        elif rec.func is None:
            raise ReferenceUnavailable(f"{rec.op} has no float64 replay")
        else:
            outs = self._op(rec)
        for k, t in enumerate(outs):
            self.values[("o", rec.index, k)] = t

    def _op(self, rec: Any) -> list[torch.Tensor]:
        """An op run again on the replayed values, by its own kernel (or a float64
        definition of it); an in-place write into a tracked tensor out of place."""
        args = [self.sub(a) for a in rec.args]
        kwargs = {k: self.sub(v) for k, v in rec.kwargs}
        if kwargs.get("dtype") is None and _makes_default_float(rec):
            kwargs["dtype"] = torch.float64  # torch.zeros(6, 8): the default dtype's
        outs: list[torch.Tensor] = []
        functional = _functional(rec, args)
        if functional is not None:
            # a no-grad write into a tensor autograd tracks (XSoftmax fills softmax's
            # output in place): its out-of-place twin (the same value) leaves what
            # backward saved intact, and torch's gradient passes the write as if it
            # were not there (builder.stopped): the written value, the gradient of
            # the tensor written into (x - x is exactly 0: the value is the twin's)
            flatten_tensors(functional(*args, **kwargs), outs)
            x = args[0]
            with torch.enable_grad():
                outs[0] = x - x.detach() + outs[0].detach()
            outs += outs[:1] if rec.mutated else []
        else:
            func = _DEFINITIONS.get(rec.op) or OUT_OF_PLACE_VIEWS.get(rec.op, rec.func)
            flatten_tensors(func(*args, **kwargs), outs)
            if rec.op in _EMPTY:
                outs = [t.fill_(math.nan) if t.is_floating_point() else t for t in outs]
            outs += [args[i] for i in rec.mutated]
        return outs

    def _unsorted_topk(self, rec: Any) -> list[torch.Tensor]:
        """topk(sorted=False) picking the elements the batch's picked, in its
        order (rules_attention.topk_keys: the draw its rule replays), not those
        float64's partial sort would keep among equals: the input in key order,
        a stable sort (the lower index first among equals), the picked in key
        order."""
        k, dim, largest, _ordered = topk_args(rec.args, dict(rec.kwargs))
        x, keys = self.sub(rec.args[0]), self.drawn[rec.index][0].detach()
        perm = torch.argsort(keys, dim=dim, stable=True)
        values, picked = torch.sort(x.gather(dim, perm), dim=dim, descending=largest, stable=True)
        values, indices = values.narrow(dim, 0, k), perm.gather(dim, picked.narrow(dim, 0, k))
        order = torch.argsort(keys.gather(dim, indices), dim=dim, stable=True)
        return [values.gather(dim, order), indices.gather(dim, order)]

    def _drawn(self, rec: Any) -> list[torch.Tensor]:
        """What a random op drew, in float64; an in-place draw writes it into its
        (replayed) target, as the op did."""
        # (d != 0 is a fresh tensor: no copy of it is needed; copy_ casts)
        drawn = [d.detach() != 0 if rec.op in _DRAWS else _up(d) for d in self.drawn[rec.index]]
        if rec.op.split(".")[1].endswith("_"):
            target = self.sub(rec.args[0])
            with torch.no_grad():
                target.copy_(drawn[0])
            return [target]
        return drawn

    def _recurrent(self, rec: Any) -> list[torch.Tensor]:
        """A recurrent call (x, hx, params, biased, layers, dropout, train,
        bidirectional, batch_first) as torch runs it (aten/src/ATen/native/RNN.cpp,
        apply_layer_stack): layer after layer, each on its slice of the initial
        states and of the parameters, the dropout between layers the batch's own
        keep masks (time-major, as the kernel drew them) times 1 / keep."""
        x, hx, params, biased, layers, dropout, train, bidirectional, batch_first = (
            self.sub(a) for a in rec.args
        )
        masks: list[tuple[torch.Tensor, float]] = []
        k = rec.index + 1
        while k < len(self.recs) and self.recs[k].op == MASK_OP:
            kept = self.drawn[k][0].detach() != 0
            masks.append(
                (kept.transpose(0, 1) if batch_first else kept, float(self.recs[k].args[2]))
            )
            k += 1
        drops = dropout > 0 and train and layers > 1
        if len(masks) != (layers - 1 if drops else 0):
            raise ReferenceUnavailable(
                f"{rec.op} drew {len(masks)} dropout masks between {layers} layers"
            )
        if not masks:  # one call, as the batch ran it (the record's replay: no draw)
            outs: list[torch.Tensor] = []
            flatten_tensors(rec.func(x, hx, params, *rec.args[3:]), outs)
            return outs
        overload = _RECURRENT[rec.op]
        dirs = 2 if bidirectional else 1
        states = list(hx) if isinstance(hx, list) else [hx]
        per = len(params) // (layers * dirs)  # w_ih, w_hh[, b_ih, b_hh][, w_hr]
        finals: list[list[torch.Tensor]] = [[] for _ in states]
        for layer in range(layers):
            lo, hi = layer * dirs, (layer + 1) * dirs
            layer_states = [s[lo:hi] for s in states]
            y, *last = overload(
                x,
                layer_states if isinstance(hx, list) else layer_states[0],
                params[lo * per : hi * per],
                biased,
                1,
                0.0,
                False,
                bidirectional,
                batch_first,
            )
            for kept_states, s in zip(finals, last, strict=True):
                kept_states.append(s)
            if layer < len(masks):
                kept, keep = masks[layer]
                y = y * (kept.to(y.dtype) / keep)
            x = y
        return [x, *(torch.cat(s, 0) for s in finals)]

    def _view_write(self, rec: Any) -> torch.Tensor:
        """The base with the region a slice or select view covers replaced; through
        a view of the whole base, the value in the base's shape or order."""
        base, value, kind, *rest = (self.sub(a) for a in rec.args)
        if kind in WHOLE_VIEWS:
            perm = inverse_order(kind, rest, base.dim())
            return value.permute(perm) if perm is not None else value.reshape(base.shape)
        if kind not in ("aten.slice.Tensor", "aten.select.int"):
            raise ReferenceUnavailable(f"a write through a {kind} view")
        out = base.clone()
        op = (
            torch.ops.aten.slice.Tensor
            if kind == "aten.slice.Tensor"
            else torch.ops.aten.select.int
        )
        view = op(out, *rest)
        view.copy_(value)
        return out


def _makes_default_float(rec: Any) -> bool:
    """A record whose op takes dtype= and was given none, that made a float
    tensor (a factory such as torch.zeros(6, 8), in the default dtype)."""
    schema = getattr(rec.func, "_schema", None)
    if schema is None or not rec.outs or rec.outs[0].dtype not in _FLOAT_DEFAULTS:
        return False
    return any(a.name == "dtype" for a in schema.arguments)


_FLOAT_DEFAULTS = ("float32", "float16", "bfloat16")


def forward64(
    tape: Tape,
    *,
    inputs: Mapping[str, torch.Tensor],
    targets: list[torch.Tensor],
    params: Mapping[str, np.ndarray],
    buffers: Mapping[str, np.ndarray],
    rec_out: list[list[Any]],
    trainable: list[str],
    draws: Mapping[int, torch.Tensor] | None = None,
) -> Callable[[], dict[str, Any]]:
    """The tape in float64, in two parts: the forward replay now, and the call
    that returns {"outputs": {role: array}, "loss": array, "grads": {param:
    array}, "updates": {buffer: array}, "loss_scale": sum |p * dloss/dp| over
    the predictions (tracelog.sample.scale_key)}: the backward and the
    arrays. ``params`` and ``buffers`` are the values when the batch began;
    ``rec_out`` the tensors each record produced (for the random draws),
    ``draws`` the values a random draw gave as it was drawn (its tensor in
    ``rec_out`` may be changed later). The call touches only the replay's
    own float64 tensors, so it may run on another thread while this one goes
    on: autograd's engine runs without the GIL, the forward's many short
    Python calls would wait for it there."""
    if tape.loss is None:
        raise ReferenceUnavailable("the batch has no loss")
    sources: dict[Ref, torch.Tensor] = {}
    leaves: dict[str, torch.Tensor] = {}
    for name, array in params.items():
        t = _up(_from_numpy(array))
        if name in trainable and t.is_floating_point():
            t.requires_grad_(True)
            leaves[name] = t
        sources[("p", name)] = t
    for name, array in buffers.items():
        sources[("b", name)] = _up(_from_numpy(array))
    for name, t in inputs.items():
        sources[("i", name)] = _up(t)
    for k, t in enumerate(targets):
        sources[("t", k)] = _up(t)
    for k, c in enumerate(tape.consts):
        sources[("c", k)] = _up(c.tensor)
    draws = draws or {}
    drawn = {
        rec.index: [draws[rec.index]] if rec.index in draws else rec_out[rec.index]
        for rec in tape.recs
        if rec.op in _DRAWS
        or rec.op in _RANDOM
        or rec.op == MASK_OP
        or (rec.op in (RRELU, TOPK) and rec.index in draws)
    }
    replay = _Replay(sources, drawn, tape.recs, tape.batch_size)
    with torch.enable_grad():
        for rec in tape.recs:
            try:
                replay.run(rec)
            except ReferenceUnavailable as e:
                replay.lose(rec, str(e))
            except Exception as e:  # an op with no float64 kernel, say
                first = (str(e).splitlines() or [""])[0][:120]
                replay.lose(rec, f"{rec.op} in float64: {type(e).__name__}: {first}")
    loss = replay.value(tape.loss)
    names = [n for n in trainable if n in leaves]
    outputs = {role: replay.value(ref) for role, ref in tape.outputs}
    updates = {name: replay.value(ref) for name, ref in tape.buffer_updates}
    wrt = [p for p in outputs.values() if isinstance(p, torch.Tensor) and p.requires_grad]
    del replay  # the rest holds only what it reads: the graph's own tensors

    def backward() -> dict[str, Any]:
        found = torch.autograd.grad(loss, [leaves[n] for n in names] + wrt, allow_unused=True)
        by_prediction, found = found[len(names) :], found[: len(names)]
        return {
            "outputs": {role: _array(t) for role, t in outputs.items()},
            "loss": _array(loss),
            "grads": {n: _array(g) for n, g in zip(names, found, strict=True) if g is not None},
            "updates": {name: _array(t) for name, t in updates.items()},
            "loss_scale": sum(  # tracelog.sample.scale_key
                float(np.abs(_array(p) * _array(g)).sum())
                for p, g in zip(wrt, by_prediction, strict=True)
                if g is not None
            ),
        }

    return backward


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    """A stored array as a tensor, for _up to copy (itself a copy only where
    torch cannot read it as it is); bfloat16 (``ml_dtypes``, which torch
    cannot read) widened to float32, exactly, on its way to float64."""
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.astype(np.float32))
    return torch.from_numpy(np.require(array, requirements=["C", "W"]))


def _array(t: torch.Tensor) -> np.ndarray:
    # the replay's own tensor, which nothing writes after it: no copy (the
    # sample file is written C-contiguous whatever its strides)
    return t.detach().cpu().numpy()
