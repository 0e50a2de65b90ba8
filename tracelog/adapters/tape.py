"""The per-batch tape: what a framework executed in one batch window, in a
light, framework-neutral form.

Every op becomes a Rec whose tensor arguments are refs (where the tensor came
from) with symbolic shapes. The tuple of Rec keys is the batch fingerprint:
equal fingerprints mean equal graphs, so the IR is built only for a
fingerprint not seen before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from math import prod
from typing import Any, NamedTuple, Protocol

from tracelog.ir import BATCH, TensorType, dim_value

# Where a tensor came from.
#   ("p", name) parameter, ("b", name) buffer, ("i", name) data input,
#   ("o", rec, k) output k of record rec, ("t", k) target k, ("c", k) constant k
Ref = tuple[Any, ...]


class TArg(NamedTuple):
    """A tensor argument or output: where it came from and its symbolic type."""

    ref: Ref
    dtype: str
    shape: tuple[int | str, ...]

    @property
    def type(self) -> TensorType:
        return TensorType(self.dtype, self.shape)


@dataclass
class Rec:
    index: int
    op: str  # "aten.convolution.default"
    region: str  # "pred" or "post"
    module: tuple[str, str]  # (path, class name)
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    outs: tuple[TArg, ...]  # returned tensors, then tensors mutated in place
    n_returned: int
    tainted: bool
    func: Any = field(default=None, compare=False, repr=False)  # the OpOverload, for replay
    mutated: tuple[int, ...] = ()  # positional args written in place, not returned
    # autograd records it (grad mode on); False under torch.no_grad(): its
    # outputs carry no gradient back to what they were computed from
    grad: bool = True

    def key(self, batch: int | None) -> tuple[Any, ...]:
        args, kwargs = self.args, self.kwargs
        if self.tainted:
            args = symbolic_ints(args, batch)
            kwargs = symbolic_ints(kwargs, batch) if kwargs else kwargs
        return (self.op, self.region, self.module, args, kwargs, self.outs, self.grad)

    def tensor_args(self) -> list[TArg]:
        found: list[TArg] = []
        _collect(self.args, found)
        _collect(tuple(v for _, v in self.kwargs), found)
        return found

    def kwarg(self, name: str, default: Any = None) -> Any:
        for k, v in self.kwargs:
            if k == name:
                return v
        return default


def _collect(obj: Any, found: list[TArg]) -> None:
    if isinstance(obj, TArg):
        found.append(obj)
    elif isinstance(obj, tuple):
        for x in obj:
            _collect(x, found)


@dataclass
class ConstInfo:
    tensor: Any  # the framework's tensor; the Builder's to_numpy reads it
    digest: str


@dataclass
class Tape:
    """One batch window's records and the facts needed to build its graphs."""

    batch_size: int | None = None
    recs: list[Rec] = field(default_factory=list)
    inputs: dict[str, TArg] = field(default_factory=dict)
    outputs: list[tuple[str, Ref]] = field(default_factory=list)  # (role, ref)
    targets: list[TArg] = field(default_factory=list)
    consts: list[ConstInfo] = field(default_factory=list)
    buffer_updates: list[tuple[str, Ref]] = field(default_factory=list)
    loss: Ref | None = None
    # the loss is computed after the forward from a loss the forward returned
    # (a Hugging Face model given labels, under a Trainer that scales it): the
    # forward's loss ops belong to the loss graph, not the prediction's
    forward_loss: bool = False
    # each symbol of the shapes but the batch ("seq", ...): the data input or
    # target, and its axis, whose size it is (graphs compute sizes from them)
    symbols: dict[str, tuple[Ref, int]] = field(default_factory=dict)
    # random draws that recorded ops read as values (Keras' GaussianNoise; not the
    # keep test of a dropout): each draw's ref and its distribution, ("normal",
    # mean, stddev) or ("uniform", low, high); the sample keeps the values drawn
    draws: dict[Ref, tuple[str, float, float]] = field(default_factory=dict)
    # selections by the data (x[mask], nonzero): each one's record index and the
    # count it selected, which the fingerprint reads as the batch size is read
    selected: list[tuple[int, int]] = field(default_factory=list)
    # data inputs the forward made from outside the framework (a numpy-drawn
    # boolean mask: base.external_mask): their dims past the batch's are made
    # to fit the model's, never sizes of their own (symbols.candidates)
    external: set[str] = field(default_factory=set)

    def fingerprint(self) -> tuple[Any, ...]:
        keys = [r.key(self.batch_size) for r in self.recs]
        if self.selected:
            # from the first selection on, an int equal to a count is that count's
            # (as a dim equal to the batch size is the batch's): batches that
            # select other numbers of rows share a fingerprint, and so their
            # graphs without a replay. A dim equal to a count by chance in one
            # batch is a number in a batch of another count: no false match.
            first = min(i for i, _ in self.selected)
            counts = frozenset(c for _, c in self.selected)
            keys[first:] = [_counted(k, counts) for k in keys[first:]]
        return (
            tuple(keys),
            tuple(self.inputs.items()),
            tuple(self.outputs),
            tuple(self.targets),
            tuple([c.digest for c in self.consts]),
            tuple(self.buffer_updates),
            self.loss,
            self.forward_loss,
            tuple(self.draws.items()),
        )


_COUNTED = "#count"  # an int equal to a selection's count, in a fingerprint


def _counted(obj: Any, counts: frozenset[int]) -> Any:
    """A record key with the ints equal to a count marked (TArg shapes and
    plain ints; never a ref's record index)."""
    kind = type(obj)
    if kind is int:
        return _COUNTED if obj in counts else obj
    if kind is TArg:
        return obj._replace(
            shape=tuple([_COUNTED if type(d) is int and d in counts else d for d in obj.shape])
        )
    if kind is tuple:
        return tuple([_counted(x, counts) for x in obj])
    return obj


def symbolic_shape(shape: Iterable[int], batch: int | None, tainted: bool) -> tuple[int | str, ...]:
    """Dims equal to the batch size of a value derived from the data become BATCH.
    A feature dim that happens to equal the batch size is marked too; the short
    last batch then makes a second, honestly counted entry."""
    # list comprehensions, not generators: this runs for every tensor of every op
    if not tainted or batch is None or batch < 2:
        return tuple([int(d) for d in shape])
    return tuple([BATCH if d == batch else int(d) for d in shape])


def symbolic_ints(obj: Any, batch: int | None) -> Any:
    """Ints equal to the batch size in the arguments of a data-derived op."""
    if batch is None or batch < 2:
        return obj
    kind = type(obj)
    if kind is int:
        return BATCH if obj == batch else obj
    if kind is TArg or not isinstance(obj, tuple):
        return obj
    # a call only for a nested tuple: every tainted record's arguments (mostly
    # TArgs and ints) go through here for the fingerprint
    return tuple(
        [
            (
                (BATCH if x == batch else x)
                if type(x) is int
                else symbolic_ints(x, batch) if type(x) is not TArg and isinstance(x, tuple) else x
            )
            for x in obj
        ]
    )


def map_targs(tape: Tape, fn: Callable[[TArg], TArg]) -> Tape:
    """A copy of the tape with every TArg (op arguments and results, data
    inputs, targets) replaced by fn of it: how the batch-dim replays write
    the dims they found."""

    def walk(obj: Any) -> Any:
        kind = type(obj)
        if kind is TArg:
            return fn(obj)
        if kind is tuple or isinstance(obj, tuple):
            return tuple([walk(x) for x in obj])
        return obj

    new = replace(tape)
    new.recs = [
        _copied(r, args=walk(r.args), kwargs=walk(r.kwargs), outs=walk(r.outs)) for r in tape.recs
    ]
    new.inputs = {k: fn(v) for k, v in tape.inputs.items()}
    new.targets = [fn(t) for t in tape.targets]
    return new


def _copied(rec: Rec, **changes: Any) -> Rec:
    """``dataclasses.replace(rec, **changes)``, less its per-call field checks
    (a replay copies every record of a tape, several times)."""
    new = object.__new__(Rec)
    new.__dict__.update(rec.__dict__)
    new.__dict__.update(changes)
    return new


def concrete_shape(shape: tuple[int | str, ...], sizes: int | dict[str, int]) -> tuple[int, ...]:
    """A recorded shape with its symbolic dims at the given sizes (an int: the
    batch size, for shapes whose only symbol is the batch)."""
    env = {BATCH: sizes} if isinstance(sizes, int) else sizes
    return tuple(dim_value(d, env) if isinstance(d, str) else int(d) for d in shape)


class Replay(Protocol):
    """One way of running a tape's records again with another batch size."""

    def run(self, rec: Rec) -> list[Any] | None:
        """The record's outputs in the replay, or None where it cannot tell."""

    def store(self, ref: Ref, value: Any) -> None:
        """Keep an output for the records that read it."""

    def resym(self, a: TArg) -> TArg:
        """The TArg with its dims re-marked by what moved in the replay."""


def replay_tape(tape: Tape, replay: Replay) -> Tape | None:
    """Run every record again through `replay`: the tape with the batch dims
    the replay found, or None when a record could not be replayed."""
    for rec in tape.recs:
        outs = replay.run(rec)
        if outs is None:
            return None
        for k, t in enumerate(outs):
            replay.store(("o", rec.index, k), t)
    return map_targs(tape, replay.resym)


def batch_multiple(tape: Tape, value: float) -> int:
    """k > 1 where value is k times the batch size and the element count of a
    batch-derived value the tape recorded in the loss (a mean over per-step
    losses divides by B * T); 0 otherwise."""
    batch = tape.batch_size
    if batch is None or batch < 2 or value <= batch or value % batch or value != int(value):
        return 0
    for rec in reversed(tape.recs):
        if rec.region != "post":
            break
        for a in rec.outs:
            symbolic = any(isinstance(d, str) for d in a.shape)
            if symbolic and prod(concrete_shape(a.shape, batch)) == value:
                return int(value) // batch
    return 0
