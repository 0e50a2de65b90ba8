"""Which dims are the batch dim: found by running the tape again on meta
tensors with a different batch size.

Marking every dim equal to the batch size is a guess that fails when a
feature dim happens to equal it (batch 64 and 64 channels). Instead, the
recorded ops are replayed on the meta device (shapes only, no data, no RNG)
with the data inputs' leading dim changed from B to B + 1; a dim is the batch
dim exactly where the two runs differ by that change. If the replay fails
(an op with no meta kernel, or an int argument that is ambiguous), the guess
stands.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import torch

from tracelog.adapters.symbols import Fixed, Shapes, Sources, with_symbols
from tracelog.adapters.tape import Ref, Tape, TArg, concrete_shape, map_targs
from tracelog.ir import BATCH, batch_dim, batch_factor, is_symbolic

from .tensors import OUT_OF_PLACE_VIEWS, TORCH_DTYPES, flatten_tensors

# Random ops keep their input's shape; replaying them would still be shape-only,
# but they are skipped so no generator is ever touched.
_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}
_EXPAND = "aten.expand.default"
_ARANGE_STEP = "aten.arange.start_step"
_ARANGE_FROM = ("aten.arange.start", _ARANGE_STEP)  # the aranges with a start
_EMBEDDING_BAGS = {"aten._embedding_bag.default", "aten._embedding_bag_forward_only.default"}
_RESHAPE = torch.ops.aten.reshape.default
_RANDOM_INPLACE = {
    "aten.bernoulli_.float",
    "aten.uniform_.default",
    "aten.normal_.default",
    "aten.exponential_.default",
}
# A packed sequence's ops (rules_recurrent.py): their sizes depend on the lengths'
# values, which meta tensors lack, so they replay by what the packing's padded input
# says (PackedReplay), never from a memo (the input is not among their arguments)
_PACK = "aten._pack_padded_sequence.default"
_PAD = "aten._pad_packed_sequence.default"
_PACKED_CALLS = {"aten.lstm.data", "aten.gru.data", "aten.rnn_tanh.data", "aten.rnn_relu.data"}
_PACKED_OPS = {_PACK, _PAD, *_PACKED_CALLS}
# CTC's loss has no meta kernel where the lengths are tensors: its per-sample losses
# are the batch of log_probs [T, N, C] (dim 1); its log-alpha, sized by the target
# lengths' values, is for aten's backward (no rule reads it) and keeps its recorded size
_CTC = {"aten._ctc_loss.Tensor", "aten._ctc_loss.default"}
# ops whose output's size is the data's (how many elements a mask selects): each
# distinct mask's count is a symbol of its own ("count", ...; selections()), and the
# replay sizes those outputs at the symbol's size (never from a memo: the size is
# the symbol's, not the arguments')
_INDEX = "aten.index.Tensor"
# native_group_norm(x, weight, bias, N, C, HxW, group, eps): N, C and HxW are x's
# sizes (its rows, channels, and the product of the rest), passed as ints; a record
# derived from the data keeps its ints, so the replay reads them from its x
_GROUP_NORM = "aten.native_group_norm.default"
_GROUPED_MM = "aten._grouped_mm.default"
_SLICE = "aten.slice.Tensor"
_UNBIND = "aten.unbind.int"
_SELECT = "aten.select.int"
SELECTS = {_INDEX, "aten.masked_select.default", "aten.nonzero.default"}

# A meta kernel's outputs are a function of its tensors' metadata and its other
# arguments: (op, argument key) -> each output's (shape, stride, dtype), or
# None where it raised. Many meta kernels are Python decompositions (most of a
# replay's time), and a model's repeated layers run the same ones on the same
# shapes. The same memo holds each record's ranked outcomes (MetaReplay.outcomes).
Memo = dict[tuple[Any, ...], tuple[tuple[Any, ...], ...] | None]
_NO_KEY = object()
_OUTCOMES = "outcomes"  # leads a memo key of a record's ranked outcomes (no kernel's key)


def exact_batch_dims(tape: Tape, *, memo: Memo | None = None) -> Tape | None:
    """A copy of the tape whose shapes mark exactly the batch-derived dims,
    and the dims that follow a sequence-like size of the data (symbols
    "seq", "seq2", ...), or None when the replay could not tell. ``memo``:
    the meta kernels' outputs by their arguments (a fresh one if None)."""
    batch = tape.batch_size
    if batch is None or batch < 2:
        return None
    if memo is None:
        memo = {}  # one for every replay of this tape: a layer's ops repeat
    with torch.no_grad():
        replay = _MetaReplay(batch, memo=memo)
        if not _replay_all(tape, replay):
            return None
        batch_tape = map_targs(tape, replay.resym)
        try:
            return with_symbols(
                tape,
                batch_tape,
                functools.partial(_replay_sizes, tape, memo),
                selections(tape),
            )
        except Exception:  # a replay this module did not foresee: the batch dims stand
            return batch_tape


def _replay_sizes(
    tape: Tape, memo: Memo, sizes: dict[str, int], sources: Sources, fixed: Fixed
) -> Shapes | None:
    """Every data-derived tensor's shape when the tape runs again on meta
    tensors with the symbols at `sizes` (the `fixed` axes keeping their size);
    None when a record cannot run so."""
    batch = tape.batch_size
    assert batch is not None
    replay = _MetaReplay(batch, sizes, sources, fixed, memo)
    for a in (*tape.inputs.values(), *tape.targets):
        replay.meta_of(a)
    if not _replay_all(tape, replay):
        return None
    return {ref: tuple(int(d) for d in t.shape) for ref, t in replay.metas.items()}


def selection_axis(rec: Any) -> int | None:
    """The axis of rec's output whose size counts what a mask selects: x[mask]'s
    place of the mask (one boolean index, the others None), 0 for
    masked_select and nonzero; None for a record that selects nothing so."""
    if rec.op == _INDEX:
        indices = rec.args[1] if len(rec.args) > 1 else ()
        masks = [k for k, t in enumerate(indices) if isinstance(t, TArg) and t.dtype == "bool"]
        if len(masks) != 1 or any(t is not None for k, t in enumerate(indices) if k != masks[0]):
            return None
        return masks[0]
    return 0 if rec.op in SELECTS else None


def iterated(recs: list[Any], rec: Any, axis: int, batch: int | None) -> bool:
    """Whether a selection's count is a number of its graph: Python iterates
    over the selected rows, reading each by itself: its output unbound along
    the count's axis (`for row in mask.nonzero()`: Tensor.__iter__), or each
    of its rows selected along it (`for i in range(len(x)): x[i]`, a count of
    2 or more). Another count is then another number of outputs or reads,
    another graph (and another fingerprint), never this one at another size:
    the count needs no symbol. (`batch`: the tape's, for a count recorded as
    the batch it equals.)"""
    if not rec.outs:
        return False
    out, shape = rec.outs[0].ref, concrete_shape(rec.outs[0].shape, batch or 0)
    rank, count = len(shape), shape[axis]
    rows: set[int] = set()
    for later in recs[rec.index + 1 :]:
        if later.op not in (_UNBIND, _SELECT) or not later.args:
            continue
        source = later.args[0]
        if not isinstance(source, TArg) or source.ref != out:
            continue
        dim = later.args[1] if len(later.args) > 1 else later.kwarg("dim", 0)
        if type(dim) is not int or dim % rank != axis:
            continue
        if later.op == _UNBIND:
            return True
        index = later.args[2] if len(later.args) > 2 else None
        if type(index) is int and 0 <= index < count:
            rows.add(index)
    return count >= 2 and len(rows) == count


def selections(tape: Tape) -> list[tuple[int, list[tuple[Ref, int]]]]:
    """The counts of the data's selections, candidates for symbols of their own
    (symbols.with_symbols): per mask (x[m] and y[m] select alike; nonzero(m)
    counts the same elements), its recorded count and the output axes it sizes.
    A count the graph iterates over (iterated) is its own number, no candidate."""
    found: dict[Any, tuple[int, list[tuple[Ref, int]]]] = {}
    for rec in tape.recs:
        axis = selection_axis(rec) if rec.op in SELECTS else None
        if axis is None or iterated(tape.recs, rec, axis, tape.batch_size):
            continue
        if rec.op == _INDEX:
            mask = rec.args[1][axis]
        else:  # nonzero(m) counts m's nonzeros; masked_select(x, m) m's
            mask = rec.args[0] if rec.op == "aten.nonzero.default" else rec.args[1]
        if not isinstance(mask, TArg):
            continue
        # masked_select broadcasts its mask: the count is the mask's only at its shape
        key = (mask.ref, rec.outs[0].shape if rec.op == "aten.masked_select.default" else None)
        count = concrete_shape(rec.outs[0].shape, tape.batch_size or 0)[axis]
        found.setdefault(key, (count, []))[1].append((("o", rec.index, 0), axis))
    return list(found.values())


@functools.cache
def _size_args(func: Any) -> frozenset[int | str] | None:
    """The positions and names of an op's arguments its schema declares sizes
    (SymInt, SymInt[]: view's size, not mean's dim or permute's dims); None
    (every argument) for an op with no schema."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    found: set[int | str] = set()
    for k, a in enumerate(schema.arguments):
        t = a.real_type
        while hasattr(t, "getElementType"):  # Optional[...], List[...]
            t = t.getElementType()
        if isinstance(t, torch.SymIntType):
            found.update((k, a.name))
    return frozenset(found)


def _following_selections(recs: list[Any]) -> set[int]:
    """The indices of the records downstream of a selection by the data."""
    counted: set[Any] = set()
    found: set[int] = set()
    for rec in recs:
        selects = rec.op in SELECTS and selection_axis(rec) is not None
        if selects or any(a.ref in counted for a in rec.tensor_args()):
            if not selects:
                found.add(rec.index)
            counted.update(o.ref for o in rec.outs)
    return found


# which reading of each int that may follow a symbol a replay takes, by position
# (0: kept; k: the k-th reading); None: the first reading of every one
Choice = dict[int, int] | None

_SHAPED_COMBINATIONS = 2048  # readings of a view's or an expand's sizes tried (choices)
_BACKTRACKS = 64  # choices undone per replay before it gives up
_PLAIN_ARGS = (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


_PLAIN_TYPES = frozenset([type(None), *_PLAIN_ARGS])


def _arg_key(x: Any) -> Any:
    """A hashable stand-in for a replayed argument, or _NO_KEY."""
    kind = type(x)
    if kind in _PLAIN_TYPES:
        return (kind, x)  # 1 and 1.0 and True are not one argument
    if isinstance(x, torch.Tensor):
        if not x.is_meta or x.storage_offset():
            return _NO_KEY
        return (torch.Tensor, tuple(x.shape), x.stride(), x.dtype)
    if isinstance(x, (list, tuple)):
        items = tuple([_arg_key(v) for v in x])
        return _NO_KEY if _NO_KEY in items else (kind, items)
    if isinstance(x, _PLAIN_ARGS):  # a subclass (an IntEnum, a bool's int)
        return (kind, x)
    return _NO_KEY


class _Slot(int):
    """The place of an int that may follow a symbol in a plan's arguments:
    the slot's number."""


class _Plan:
    """A record's arguments on the replay's meta tensors, with the ints that
    may follow a symbol left as slots: built once per record, filled per
    choice (the tensors and the memo key's bulk do not depend on it)."""

    def __init__(
        self,
        args: list[Any],
        kwargs: dict[str, Any],
        slots: list[tuple[int, list[int]]],
        key: Any,
    ) -> None:
        self.args, self.kwargs = args, kwargs
        self.slots = slots  # each slot's recorded int and its readings
        self.key = key  # the memo key of the arguments, slots as themselves

    def values(self, chosen: Choice) -> tuple[int, ...]:
        """Each slot's int: kept (choice 0) or one of its readings at the
        replay's sizes (choice k: the k-th; None: the first)."""
        if chosen is None:
            return tuple([alternatives[0] for _x, alternatives in self.slots])
        return tuple(
            [
                alternatives[pick - 1] if (pick := chosen.get(i, 0)) else x
                for i, (x, alternatives) in enumerate(self.slots)
            ]
        )

    def filled(
        self, values: tuple[int, ...], infer: int | None
    ) -> tuple[list[Any], dict[str, Any]]:
        """The arguments with each slot at its value (fresh lists: a kernel
        never sees another try's)."""
        args = [_fill(a, values) for a in self.args]
        kwargs = {k: _fill(v, values) for k, v in self.kwargs.items()}
        if infer is not None:
            args[1] = [-1 if i == infer else d for i, d in enumerate(args[1])]
        return args, kwargs


def _fill(obj: Any, values: tuple[int, ...]) -> Any:
    if type(obj) is _Slot:
        return values[obj]
    if type(obj) is list:
        return [_fill(x, values) for x in obj]
    return obj


def _cannot_fit(rec: Any, plan: _Plan, values: tuple[int, ...], infer: int | None) -> bool:
    """A view whose sizes cannot hold its input's element count (their
    product differs, or divides it not where one size is -1, or two sizes
    are -1), or an expand to sizes that differ from its input's non-unit
    dims: the kernel would raise (and raising costs more than the check)."""
    if (rec.op not in _VIEWS and rec.op != _EXPAND) or len(plan.args) < 2:
        return False
    src, sizes = plan.args[0], plan.args[1]
    if not isinstance(src, torch.Tensor) or type(sizes) is not list:
        return False
    sizes = [values[d] if type(d) is _Slot else d for d in sizes]
    if infer is not None:
        sizes[infer] = -1
    if any(type(d) is not int or d < -1 for d in sizes):
        return False  # the kernel decides
    if rec.op == _EXPAND:
        shape = tuple(src.shape)
        if -1 in sizes:
            return False  # a kept dim: the kernel decides
        if len(sizes) < len(shape):
            return True
        return any(
            d != 1 and n != d for d, n in zip(shape, sizes[len(sizes) - len(shape) :], strict=True)
        )
    inferred = sizes.count(-1)
    if inferred > 1:
        return True
    product = math.prod(d for d in sizes if d != -1)
    if inferred:
        return product != 0 and src.numel() % product != 0
    return product != src.numel()


def _replay_all(tape: Tape, replay: _MetaReplay) -> bool:
    """Run every record again, taking each record's most likely choice; when
    a later record cannot run, go back to the latest record that had another
    choice (a [T*B] dim split into (T, B): which factor is the batch shows
    only later). False when no assignment of choices runs."""
    stack: list[tuple[int, list[list[torch.Tensor]], int, dict[Ref, torch.Tensor]]] = []
    i, undone = 0, 0
    recs = replay.recs = tape.recs
    while i < len(recs):
        rec = recs[i]
        outcomes = replay.outcomes(rec)
        pick = 0
        while not outcomes:
            if not stack or undone >= _BACKTRACKS:
                return False
            i, outcomes, pick, before = stack.pop()
            undone += 1
            replay.metas = dict(before)
            rec = recs[i]
        if pick + 1 < len(outcomes):
            # the state to go back to: rec's outputs not stored yet (the metas its
            # planning added are its inputs' own, the same whichever choice runs)
            stack.append((i, outcomes, pick + 1, dict(replay.metas)))
        for k, t in enumerate(outcomes[pick]):
            replay.store(("o", rec.index, k), t)
        i += 1
    return True


_UNSEEN = object()
# per OpOverload: False (not pointwise), "new" (a pointwise op that returns a new
# tensor) or "self" (one that writes its first argument in place)
_POINTWISE: dict[Any, Any] = {}


def _pointwise(func: Any) -> Any:
    """How a pointwise op (torch's ``pointwise`` tag: its output is its tensor
    arguments broadcast together, element by element) returns: "new", "self",
    or False for any other op, an out= variant, or several outputs."""
    kind = _POINTWISE.get(func, _UNSEEN)
    if kind is _UNSEEN:
        kind = False
        schema = getattr(func, "_schema", None)
        if (
            schema is not None
            and torch.Tag.pointwise in getattr(func, "tags", ())
            and len(schema.returns) == 1
            and not any(a.is_out for a in schema.arguments)
        ):
            written = [
                k
                for k, a in enumerate(schema.arguments)
                if a.alias_info is not None and a.alias_info.is_write
            ]
            kind = "new" if not written else "self" if written == [0] else False
        _POINTWISE[func] = kind
    return kind


def _pointwise_meta(rec: Any, kind: str, args: list[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    """A pointwise op's output on meta tensors: its tensor arguments' shapes
    broadcast together (raising where they do not broadcast, or where an
    in-place op's broadcast is not its target's shape, as the kernel raises),
    in the dtype it recorded (a replay changes sizes, never dtypes). torch's
    meta kernels for these are Python references (type promotion, strides,
    symbolic-size checks: about 0.1 ms a call, most of a replay's kernel time)."""
    shapes = [a.shape for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    shape = torch.broadcast_shapes(*shapes)
    if kind == "self":
        if tuple(shape) != tuple(args[0].shape):
            raise RuntimeError(f"in place: broadcast {list(shape)} is not {list(args[0].shape)}")
        return args[0]
    return torch.empty(shape, dtype=TORCH_DTYPES[rec.outs[0].dtype], device="meta")


def _grouped_mm_meta(rec: Any, a: torch.Tensor, b: torch.Tensor, offs: Any = None) -> torch.Tensor:
    """torch._grouped_mm's output on meta tensors, shaped as its meta kernel
    shapes it (torch._meta_registrations), whose checks are CUDA's (bfloat16
    only, rows 16-byte aligned) though CPU runs any float: a replay through it
    failed at every choice. The inner sizes must agree, as the kernel's do."""
    groups = -1 if offs is None else int(offs.shape[0])  # -1: no offsets, no groups
    m, k = a.shape[-2], a.shape[-1]
    if a.dim() == 2 and b.dim() == 3:  # rows by group: [M, K] x [G, K, N] -> [M, N]
        ok, shape = k == b.shape[1] and groups == b.shape[0], [m, b.shape[2]]
    elif a.dim() == 2 and b.dim() == 2:  # K by group: [M, K] x [K, N] -> [G, M, N]
        ok, shape = k == b.shape[0] and groups >= 0, [groups, m, b.shape[1]]
    elif a.dim() == 3 and b.dim() == 2:  # [G, M, K] x [K, N] by group -> [M, N]
        ok, shape = k == b.shape[0] and groups == a.shape[0], [m, b.shape[1]]
    else:  # a batched matrix product
        ok = a.dim() == b.dim() == 3 and a.shape[0] == b.shape[0] and k == b.shape[1]
        shape = [a.shape[0], m, b.shape[-1]]
    if not ok:
        raise RuntimeError(f"_grouped_mm of {list(a.shape)} and {list(b.shape)}")
    return torch.empty(shape, dtype=TORCH_DTYPES[rec.outs[0].dtype], device="meta")


class _MetaReplay:
    """The tape's records run again on meta tensors whose data inputs have
    B + 1 rows instead of B (and, given `sizes`, other symbols at other
    sizes): the meta tensor of each ref, and how to rerun a record and read
    which of its dims moved."""

    def __init__(
        self,
        batch: int,
        sizes: dict[str, int] | None = None,
        sources: Sources | None = None,
        fixed: Fixed | None = None,
        memo: Memo | None = None,
    ) -> None:
        self.fixed = fixed or {}
        self.memo = memo
        self.batch = batch
        self.sizes = sizes if sizes is not None else {BATCH: batch + 1}
        self.other = self.sizes.get(BATCH, batch)
        self.sources = sources or {}
        # the batch alone: every moved dim must move as k*B -> k*(B + 1)
        self.strict = set(self.sizes) == {BATCH}
        self.metas: dict[Ref, torch.Tensor] = {}
        self.recs: list[Any] = []  # the tape's records (a packed sequence's ops read its packing)
        self._tainted = False  # of the record being planned
        # each symbol's size in the recording, and each int's readings as a multiple
        self._base = {BATCH: batch, **{s: n for s, (n, _) in self.sources.items()}}
        self._multiples: dict[tuple[int, bool, bool], list[int]] = {}
        # the count symbols this replay sizes, and the records that follow a selection
        # (read from self.recs once they are set: _following)
        self._counts = {s for s in self.sizes if s.startswith("count")}
        self._after_selection = False
        # whether the argument being planned is declared a size (SymInt): of its
        # schema's or an unknown op's (_size_args)
        self._sized = True
        self._follow: set[int] | None = None
        self._concrete: dict[tuple[int | str, ...], tuple[int, ...]] = {}

    @property
    def _following(self) -> set[int]:
        """The records that read a selection's output, or a record's that does
        (empty where this replay sizes no count)."""
        if self._follow is None:
            self._follow = _following_selections(self.recs) if self._counts else set()
        return self._follow

    def meta_of(self, a: TArg) -> torch.Tensor:
        t = self.metas.get(a.ref)
        if t is None:
            shape = list(concrete_shape(a.shape, self.batch))
            if a.ref[0] in ("i", "t") and shape:
                shape[0] = self.other  # the data's leading dim is the batch by definition
                if a.ref[0] == "t" and is_symbolic(a.shape[0]):
                    shape[0] *= self._merged_factor(batch_factor(a.shape[0]))
            for symbol, (_size, places) in self.sources.items():
                for ref, axis in places:
                    if ref == a.ref and symbol in self.sizes:
                        shape[axis] = self.sizes[symbol]
            t = torch.empty(shape, dtype=TORCH_DTYPES[a.dtype], device="meta")
            self.metas[a.ref] = t
        return t

    def _merged_factor(self, k: int) -> int:
        """A target flattened with the batch ([B*T] labels): its factor k at the
        replay's sizes, T followed where k is a sequence symbol's size."""
        for symbol, (size, _places) in self.sources.items():
            if symbol in self.sizes and size >= 2 and k % size == 0:
                return k // size * self.sizes[symbol]
        return k

    def plan(self, rec: Any) -> _Plan:
        """rec's arguments with TArgs replaced by meta tensors, and a _Slot in
        place of each int that may follow a symbol: the ints inside size lists
        that are multiples k*B of the batch (and, other symbols given, of
        their products), and a lone int (groups, dim, a split size) only where
        it equals a symbol's size in a record not derived from the data
        (arange's end, a slice of a position table). Slots are numbered in
        the order of the arguments, then the keyword arguments."""
        self._tainted = rec.tainted
        self._after_selection = rec.index in self._following
        slots: list[tuple[int, list[int]]] = []
        sized = _size_args(rec.func)
        args = []
        for k, a in enumerate(rec.args):
            self._sized = sized is None or k in sized
            args.append(self._arg(rec, k, a, slots))
        kwargs = {}
        for name, v in rec.kwargs:
            self._sized = sized is None or name in sized
            kwargs[name] = self._sub(v, slots)
        self._sized = True
        if "device" in kwargs:
            kwargs["device"] = torch.device("meta")
        key = _arg_key((args, sorted(kwargs.items())))
        return _Plan(args, kwargs, slots, key)

    def _sub(self, obj: Any, slots: list[tuple[int, list[int]]]) -> Any:
        if isinstance(obj, TArg):
            return self.meta_of(obj)
        if isinstance(obj, tuple):
            return [self._sub_item(x, slots) for x in obj]
        if isinstance(obj, torch.device):
            return torch.device("meta")
        if type(obj) is int and not self._tainted:
            alternatives = self._lone(obj)
            if alternatives:
                return self._slot(obj, alternatives, slots)
        return obj

    def _arg(self, rec: Any, k: int, a: Any, slots: list[tuple[int, list[int]]]) -> Any:
        """rec's k-th positional argument as plan() substitutes it."""
        if k == 0 and rec.op in _ARANGE_FROM and type(a) is int:
            # an arange's start is never read as following a size: the rule writes
            # it as the number it was, so arange(T, 2T) read so gave a `seq`-long
            # graph whose positions were T's for every length
            return a
        if k == 1 and rec.op == _ARANGE_STEP:
            return self._end(a, slots)
        if k == 2 and rec.op == _SLICE:
            return self._start(rec, a, slots)
        if k == 1 and rec.op == _EXPAND and isinstance(a, tuple):
            return self._expanded(rec, a, slots)
        return self._sub(a, slots)

    def _expanded(
        self, rec: Any, sizes: tuple[Any, ...], slots: list[tuple[int, list[int]]]
    ) -> Any:
        """expand(x, sizes)'s sizes: where x's dim (sizes aligned to its end)
        was not 1 in the recording, expand keeps it, so the size is x's dim in
        the replay, with no reading of its own (an int equal to several
        symbols' sizes there: Switch's [4, 2, 16, 8], batch 4, heads 2, a count
        of 2, length 8, gave 180 combinations of readings, past what is
        tried); the others (new leading dims, dims of 1 broadcast) are read
        as a size list's ints are."""
        source = rec.args[0]
        src = self.metas.get(source.ref) if isinstance(source, TArg) else None
        if src is None or src.dim() > len(sizes):
            return self._sub(sizes, slots)
        recorded = self._recorded(source.shape)
        lead = len(sizes) - src.dim()
        found: list[Any] = []
        for i, x in enumerate(sizes):
            if i >= lead and type(x) is int and x == recorded[i - lead] != 1:
                found.append(int(src.shape[i - lead]))
            else:
                found.append(self._sub_item(x, slots))
        return found

    def _end(self, x: Any, slots: list[tuple[int, list[int]]]) -> Any:
        """arange(start, end, step)'s end, read as a multiple k*B of the batch
        too: F.embedding_bag's offsets of a [B, L] input are arange(0, B*L, L)."""
        if type(x) is int and x > 0 and not self._tainted:
            alternatives = self._multiple(x)
            if alternatives:
                return self._slot(x, alternatives, slots)
        return self._sub(x, slots)

    def _start(self, rec: Any, x: Any, slots: list[tuple[int, list[int]]]) -> Any:
        """A slice's start where the slice runs to its input's end (a table of L
        positions cut to its last T, `bias[:, L - T:]`: MPT's ALiBi bias): the
        length kept, L - start (or -start), read as a lone int is, moves the
        start, in a record not derived from the data. Of data, only a start
        of -n that keeps the input whole (n its length) reads as keeping it
        whole (NLLB-MoE's router keeps a flattened [B, T] mask's last B*T
        tokens, `mask[-nb_tokens:]`)."""
        source = rec.args[0]
        if type(x) is not int or not isinstance(source, TArg):
            return self._sub(x, slots)
        dim = int(rec.args[1]) if len(rec.args) > 1 else 0
        end = rec.args[3] if len(rec.args) > 3 else None
        size = self._recorded(source.shape)[dim]  # (a dim the recorded slice took: in range)
        if not (end is None or (type(end) is int and end >= size)):
            return self._sub(x, slots)
        if self._tainted:
            src = self.metas.get(source.ref)
            if x == -size and src is not None and src.shape[dim] != size:
                return self._slot(x, [-int(src.shape[dim])], slots)
            return self._sub(x, slots)
        if not isinstance(source.shape[dim], int):
            return self._sub(x, slots)  # a batch dim: the batch's slices are the rule's
        if 0 < x < size:
            readings = [size - n for n in self._kept(size - x)]
        elif -size <= x < 0:
            readings = [-n for n in self._kept(-x)]
        else:
            readings = []
        return self._slot(x, readings, slots) if readings else self._sub(x, slots)

    def _sub_item(self, x: Any, slots: list[tuple[int, list[int]]]) -> Any:
        """One item of a tuple argument: a batch-multiple int is a slot;
        anything else is substituted."""
        if type(x) is int and x > 0:
            alternatives = self._multiple(x)
            if alternatives:
                return self._slot(x, alternatives, slots)
        return self._sub(x, slots)

    @staticmethod
    def _slot(x: int, alternatives: list[int], slots: list[tuple[int, list[int]]]) -> _Slot:
        slots.append((x, alternatives))
        return _Slot(len(slots) - 1)

    def _kept(self, n: int) -> list[int]:
        """The readings of the length a slice keeps to its input's end: a size
        the replay changes, or a multiple of one, as a size list's ints are
        (NLLB-MoE's router keeps a flattened [B, T] mask's last B*T tokens,
        `mask.reshape(-1)[-nb_tokens:]`)."""
        readings = self._lone(n)
        return readings + [m for m in self._multiple(n) if m not in readings]

    def _lone(self, x: int) -> list[int]:
        """The readings of a lone int of a record not derived from the data:
        a size the replay changes (arange(B) for a batch index, arange(T))."""
        # (a count follows only from a selection: no record outside the data reads it)
        return [
            size
            for symbol, size in self.sizes.items()
            if x >= 2 and x == self._base[symbol] and symbol not in self._counts
        ]

    def _multiple(self, x: int) -> list[int]:
        """x read as k times a product of symbol sizes, at the replay's sizes:
        one reading per group of symbols that divides it, most symbols first
        (remembered: a model's size lists repeat)."""
        after, sized = self._after_selection, self._sized
        readings = self._multiples.get((x, after, sized))
        if readings is not None:
            return readings
        if self.strict:
            readings = [x // self.batch * self.other] if x % self.batch == 0 else []
        else:
            base = self._base
            # a count is read only by records that follow a selection (an int equal
            # to it elsewhere, heads = batch = count, is not it)
            symbols = [s for s in self.sizes if after or s not in self._counts]
            readings = []
            for n in range(len(symbols), 0, -1):
                for group in itertools.combinations(symbols, n):
                    if n > 1 and any(base[s] < 2 for s in group):
                        # a factor of 1 leaves the product as it was: the group
                        # without it reads it, its reading alone is expand(1, C)'s
                        continue
                    size = math.prod(base[s] for s in group)
                    if size < 2:  # a count of 0 or 1 divides nothing or everything:
                        # only an int equal to it reads it (expand(n, C)), in an
                        # argument that is a size (mean(x, dim=[1]): a dim, no count)
                        if x != size or not sized:
                            continue
                        new = math.prod(self.sizes[s] for s in group)
                    elif x % size:
                        continue
                    else:
                        new = x // size * math.prod(self.sizes[s] for s in group)
                    if new not in readings:
                        readings.append(new)
        self._multiples[(x, after, sized)] = readings
        return readings

    def run_with(
        self, rec: Any, plan: _Plan, values: tuple[int, ...], infer: int | None = None
    ) -> list[torch.Tensor]:
        """Run rec with each slot of its plan at `values`; `infer`: the position
        in a view's size list to write as -1 (a size merged from an affine one,
        B*(T-1): the view infers it from the input)."""
        if not rec.outs:  # .item() and the like: no tensor to follow (and no meta kernel)
            return []
        if rec.op in _RANDOM_INPLACE:
            return [plan.args[0]]
        if (
            self.memo is None
            or rec.mutated
            or plan.key is _NO_KEY
            or rec.op in _PACKED_OPS
            or rec.op in SELECTS
        ):
            args, kwargs = plan.filled(values, infer)
            return self._call(rec, args, kwargs) + [args[i] for i in rec.mutated]
        # the plan's key and the slots' values (and -1's place) say the arguments
        key = (rec.func, plan.key, values, infer)
        if key in self.memo:
            metas = self.memo[key]
            if metas is None:
                raise RuntimeError("this choice failed before")  # as it did then
            return [torch.empty_strided(s, st, dtype=d, device="meta") for s, st, d in metas]
        args, kwargs = plan.filled(values, infer)
        try:
            outs = self._call(rec, args, kwargs)
        except Exception:
            self.memo[key] = None
            raise
        ins = {id(a) for a in args if isinstance(a, torch.Tensor)}
        if all(
            o.device.type == "meta" and not o.storage_offset() and id(o) not in ins for o in outs
        ):
            # (an output that is its input, or a view at an offset, is not remembered)
            self.memo[key] = tuple((tuple(o.shape), o.stride(), o.dtype) for o in outs)
        return outs

    def _call(self, rec: Any, args: list[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        if rec.op in _PACKED_OPS:
            return self._packed(rec, args)
        if rec.op in _CTC:
            return self._ctc(rec, args)
        if rec.op in SELECTS:
            axis = selection_axis(rec)
            if axis is not None:
                return [self._selected(rec, args, axis)]
        if rec.op == _GROUPED_MM:
            return [_grouped_mm_meta(rec, *args[:3])]
        if rec.op == _GROUP_NORM and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
            x = args[0]
            args = [*args[:3], x.shape[0], x.shape[1], math.prod(x.shape[2:]), *args[6:]]
        # a view replays as a reshape: the tape holds values, not layouts (the
        # contiguous copy that torch made before an _unsafe_view is an alias
        # there), so a view the source ran may not be one of the replay's metas
        func = _RESHAPE if rec.op in _VIEWS else OUT_OF_PLACE_VIEWS.get(rec.op, rec.func)
        pointwise = _pointwise(func)
        if pointwise:
            return [_pointwise_meta(rec, pointwise, args, kwargs)]
        outs: list[torch.Tensor] = []
        flatten_tensors(func(*args, **kwargs), outs)
        if rec.op in _EMBEDDING_BAGS:
            # its other outputs are buffers for aten's backward, sized on CPU
            # otherwise than the meta kernel sizes them (offset2bag is empty on
            # the sum's fast path): no rule reads them, they keep their sizes
            outs[1:] = [
                torch.empty(self._recorded(a.shape), dtype=TORCH_DTYPES[a.dtype], device="meta")
                for a in rec.outs[1:]
            ]
        return outs

    def _packed(self, rec: Any, args: list[Any]) -> list[torch.Tensor]:
        """A packed sequence's op on meta tensors, sized as rules_recurrent.py
        reads it: the packed rows keep their recorded number (the lengths'
        sum), the steps and the batch are the packing's padded input's, and
        padding back gives that input's steps where the recording did (else
        the steps it recorded: the longest length, a number)."""
        packing = rec if rec.op == _PACK else self._packing(rec.args[1])
        x = args[0] if rec.op == _PACK else self.metas.get(packing.args[0].ref)
        if x is None or x.dim() != 3:
            raise ValueError("no packing of this packed sequence in the replay")
        first = bool(packing.args[2])
        batch, steps = (x.shape[0], x.shape[1]) if first else (x.shape[1], x.shape[0])
        rows = self._recorded(rec.outs[0].shape)[0] if rec.op != _PAD else 0
        if rec.op == _PACK:
            if tuple(args[1].shape) != (batch,):
                raise ValueError("lengths that do not fit the packed batch")
            return [
                x.new_empty((rows, *x.shape[2:])),
                torch.empty((steps,), dtype=torch.int64, device="meta"),
            ]
        if rec.op == _PAD:
            was = self._recorded(rec.outs[0].shape)
            recorded_steps = was[1] if bool(args[2]) else was[0]
            x_was = self._recorded(packing.args[0].shape)
            if recorded_steps != (x_was[1] if first else x_was[0]):
                steps = recorded_steps  # cut to the longest length: a number
            data = args[0]
            shape = (batch, steps) if bool(args[2]) else (steps, batch)
            return [
                data.new_empty((*shape, *data.shape[1:])),
                torch.empty((batch,), dtype=torch.int64, device="meta"),
            ]
        # the layer's .data call: (data, batch_sizes, hx, params, has_biases,
        # num_layers, dropout, train, bidirectional)
        hx, params = args[2], args[3]
        layers, dirs = int(args[5]), 2 if bool(args[8]) else 1
        states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        hidden = params[1].shape[1]
        if args[0].shape[-1] != params[0].shape[1] or any(
            s.dim() != 3 or tuple(s.shape[:2]) != (layers * dirs, batch) for s in states
        ):
            raise ValueError("the state does not fit the packed batch and the layer")
        return [args[0].new_empty((rows, dirs * hidden)), *[s.new_empty(s.shape) for s in states]]

    def _ctc(self, rec: Any, args: list[Any]) -> list[torch.Tensor]:
        """aten._ctc_loss on meta tensors: the losses [N] for log_probs [T, N, C],
        where the targets and tensor lengths fit N; log-alpha as recorded
        but for its batch."""
        log_probs, targets = args[0], args[1]
        if log_probs.dim() != 3:
            raise ValueError("CTC loss of unbatched log-probabilities")
        n = log_probs.shape[1]
        lengths = [a for a in args[2:4] if isinstance(a, torch.Tensor)]
        if any(t.dim() > 1 or t.numel() != n for t in lengths) or (
            targets.dim() == 2 and targets.shape[0] != n
        ):
            raise ValueError("CTC targets or lengths that do not fit the batch")
        alpha = self._recorded(rec.outs[1].shape)
        return [
            log_probs.new_empty((n,)),
            log_probs.new_empty((n, *alpha[1:])),
        ]

    def _selected(self, rec: Any, args: list[Any], axis: int) -> torch.Tensor:
        """A selection by the data on meta tensors (no meta kernel can size it):
        its count the replay's size of the count's symbol, else as recorded."""
        place = (("o", rec.index, 0), axis)
        count = self._recorded(rec.outs[0].shape)[axis]
        for symbol, (_size, places) in self.sources.items():
            if place in places and symbol in self.sizes:
                count = self.sizes[symbol]
        x = args[0]
        if rec.op == "aten.nonzero.default":
            return torch.empty((count, x.dim()), dtype=torch.int64, device="meta")
        if rec.op == "aten.masked_select.default":
            torch.broadcast_shapes(x.shape, args[1].shape)  # raises where they do not fit
            return x.new_empty((count,))
        mask = args[1][axis]
        if tuple(mask.shape) != tuple(x.shape[axis : axis + mask.dim()]):
            raise ValueError("a boolean index that does not fit the indexed dims")
        return x.new_empty((*x.shape[:axis], count, *x.shape[axis + mask.dim() :]))

    def _packing(self, batch_sizes: Any) -> Any:
        """The pack_padded_sequence record whose batch sizes these are (a layer's
        output keeps its input's)."""
        if not isinstance(batch_sizes, TArg) or batch_sizes.ref[0] != "o":
            raise ValueError("batch sizes not made by pack_padded_sequence")
        rec = self.recs[batch_sizes.ref[1]]
        if rec.op != _PACK:
            raise ValueError("batch sizes not made by pack_padded_sequence")
        return rec

    def choices(self, plan: _Plan, limit: int = 128) -> list[Choice]:
        """Which batch-valued ints in size lists follow the batch is ambiguous
        when a feature dim equals it (view(x, [B, B])): all of them, each
        alone, and none; records not derived from the data too (a buffer
        expanded to [B, T], arange(B)). With several symbols, each int may
        be read as any of them (B = 4 and T = 8 both divide 8), so every
        combination is tried, most ints following first, up to `limit`
        combinations."""
        readings = [len(alternatives) for _x, alternatives in plan.slots]
        n = len(readings)
        if not self.strict and 1 <= n and math.prod(r + 1 for r in readings) <= limit:
            combos = itertools.product(*(range(r + 1) for r in readings))
            ranked = sorted(combos, key=lambda c: (-sum(1 for k in c if k), c))
            return [{i: k for i, k in enumerate(c) if k} for c in ranked]
        return [None] + ([{i: 1} for i in range(n)] + [{}] if n else [])

    def store(self, ref: Ref, value: Any) -> None:
        self.metas[ref] = value

    def run(self, rec: Any) -> list[torch.Tensor] | None:
        """The replayed outputs of rec under the most likely choice; None when
        no choice runs."""
        outcomes = self.outcomes(rec)
        return outcomes[0] if outcomes else None

    def outcomes(self, rec: Any) -> list[list[torch.Tensor]]:
        """The replayed outputs of rec under each choice whose outputs change
        only by B -> B + 1 (other symbols: as a view allows), most likely first:
        the one that moves the earliest dims (the batch leads in the data)."""
        plan = self.plan(rec)
        # a record's ranked outcomes, as each output's (shape, stride, dtype), are
        # remembered by what decides them: a model's repeated layers replay alike
        key = self._outcomes_key(rec, plan)
        if key is not None:
            known = self.memo.get(key)  # type: ignore[union-attr]
            if known is not None:
                return [
                    [torch.empty_strided(s, st, dtype=d, device="meta") for s, st, d in outs]
                    for outs in known
                ]
        found = self._outcomes_of(rec, plan)
        if key is not None:
            inputs: list[torch.Tensor] = []
            flatten_tensors((plan.args, list(plan.kwargs.values())), inputs)
            ins = {id(t) for t in inputs}
            if all(
                o.device.type == "meta" and not o.storage_offset() and id(o) not in ins
                for outs in found
                for o in outs
            ):
                self.memo[key] = tuple(  # type: ignore[index]
                    tuple((tuple(o.shape), o.stride(), o.dtype) for o in outs) for outs in found
                )
        return found

    def _outcomes_key(self, rec: Any, plan: _Plan) -> tuple[Any, ...] | None:
        """What decides a record's outcomes in this replay (its op, its
        arguments' metas and ints, the shapes it recorded, the dims that must
        not move): a repeated layer's records share it. None where an outcome
        would hold one of the record's own inputs (in place, a random fill),
        or with no memo."""
        if (
            self.memo is None
            or plan.key is _NO_KEY
            or rec.mutated
            or rec.op in _RANDOM_INPLACE
            or rec.op in _PACKED_OPS
            or rec.op in SELECTS
        ):
            return None
        source = rec.args[0].shape if rec.op in _VIEWS and isinstance(rec.args[0], TArg) else None
        return (
            _OUTCOMES,
            # (not the sizes: they act only through the metas and the ints'
            # readings, so a record whose arguments no symbol moves, a weight's
            # transpose, is ranked once for all the replays of other symbols)
            self.strict,
            rec.func,
            plan.key,
            tuple([(x, tuple(readings)) for x, readings in plan.slots]),
            rec.tainted,
            tuple([a.shape for a in rec.outs]),
            source,
            tuple(
                [
                    tuple(sorted(self.fixed.get(("o", rec.index, k), {}).items()))
                    for k in range(len(rec.outs))
                ]
            ),
        )

    def _outcomes_of(self, rec: Any, plan: _Plan) -> list[list[torch.Tensor]]:
        # a view's or an expand's wrong combinations are told by their sizes'
        # product (_cannot_fit), not run: more of them are tried (a view of
        # [B, H, D, T] to [8, 16, 8] with B = 4, H = 2, a count of 2, T = 8)
        limit = _SHAPED_COMBINATIONS if rec.op in _VIEWS or rec.op == _EXPAND else 128
        tries: list[tuple[Choice, int | None]] = [(c, None) for c in self.choices(plan, limit)]
        if not self.strict and rec.op in _VIEWS and isinstance(rec.args[1], tuple):
            tries += [(None, i) for i in range(len(rec.args[1]))]
        found = self._ranked(rec, plan, tries)
        if not found and self.strict and rec.tainted:
            # a sequence length that is a multiple of the batch (B = 4, T = 8):
            # which of several batch-multiple ints follow needs any subset
            n = len(plan.slots)
            if 2 < n <= 6:
                subsets = itertools.chain.from_iterable(
                    itertools.combinations(range(n), k) for k in range(n - 1, 1, -1)
                )
                found = self._ranked(rec, plan, [({i: 1 for i in c}, None) for c in subsets])
        return found

    def _ranked(
        self, rec: Any, plan: _Plan, tries: list[tuple[Choice, int | None]]
    ) -> list[list[torch.Tensor]]:
        ranked: dict[tuple[tuple[int, ...], ...], tuple[Any, list[torch.Tensor]]] = {}
        tried: set[tuple[tuple[int, ...], int | None]] = set()
        for chosen, infer in tries:
            values = plan.values(chosen)
            if (values, infer) in tried:
                continue  # the same arguments as an earlier try (None and {0: 1} of one int)
            tried.add((values, infer))
            if _cannot_fit(rec, plan, values, infer):
                continue  # it would raise: most wrong choices of a view or an expand
            try:
                outs = self.run_with(rec, plan, values, infer)
            except Exception:  # no meta kernel, or this choice is wrong
                continue
            moved = self.changes(rec, outs)
            if moved is None or not self._view_kept(rec, outs):
                continue
            # the batch alone: the choice that moves the earliest dims first (the
            # batch leads in the data); with other symbols, the one that moves the
            # most dims (most ints following, as choices() ranks them): a record no
            # later one constrains (torch.ones(B, T) whose only reader is .all())
            # then reads alike in every replay. Earliest-first, T's own replay gave
            # (B, T + 1) but the replay of both gave (B + 1, T), and T's fit failed
            # its check (BART's decoder mask: a graph per target length)
            most = 0 if self.strict else -len(moved)
            key = (self._unlikely(rec, outs), not moved, most, moved)
            shapes = tuple(tuple(t.shape) for t in outs)
            if shapes not in ranked or key < ranked[shapes][0]:
                ranked[shapes] = (key, outs)
        return [outs for _key, outs in sorted(ranked.values(), key=lambda ko: ko[0])]

    def _unlikely(self, rec: Any, outs: list[torch.Tensor]) -> int:
        """How many dims of a record not derived from the data this choice moves
        from a multiple k*B (k > 1) of the batch: such a size is more likely a
        number of its own (torch.ones(8, 8) in a batch of 4) than the batch's
        size scaled, which x.size(0) gives as itself. Where the replay runs
        either way, the reading that keeps it ranks first (a later record that
        needs it moved still backtracks to it); 0 for data-derived records
        and in the replays of other symbols."""
        if rec.tainted or not self.strict:
            return 0
        count = 0
        for k, t in enumerate(outs):
            concrete = self._recorded(rec.outs[k].shape)
            if t.dim() != len(concrete):
                continue
            count += sum(
                1 for d, m in zip(concrete, t.shape, strict=True) if d != m and d != self.batch
            )
        return count

    def _view_kept(self, rec: Any, outs: list[torch.Tensor]) -> bool:
        """A view regroups dims without moving elements across groups: where
        its input and output shapes share a prefix product in the recording
        (view(x[T, B, E], [T, B*H, D]): T), they share it in the replay too, so
        a choice that moves T for the batch is wrong however the sizes multiply;
        and a view of an input the replay kept is the view it recorded."""
        if rec.op not in _VIEWS or not isinstance(rec.args[0], TArg):
            return True
        src = self.metas.get(rec.args[0].ref)
        if src is None:
            return True
        was_in = self._recorded(rec.args[0].shape)
        was_out = self._recorded(rec.outs[0].shape)
        now_in, now_out = tuple(src.shape), tuple(outs[0].shape)
        if now_in == was_in:
            # an input the replay kept keeps its view: an int equal to a symbol's
            # size (a count equal to the batch, or of 1: view(x, [-1, 1, E]) after
            # a selection) read as following it only regroups the same elements
            return now_out == was_out
        ends_in, ends_out = _prefix_ends(was_in), _prefix_ends(was_out)
        for product in ends_in.keys() & ends_out.keys():
            a, b = ends_in[product], ends_out[product]
            if math.prod(now_in[: a + 1]) != math.prod(now_out[: b + 1]):
                return False
        return True

    def changes(self, rec: Any, outs: list[torch.Tensor]) -> tuple[int, ...] | None:
        """Positions where the replay moved a dim from B to B + 1; None if it
        changed any dim some other way (then this choice, or the replay, is wrong)."""
        if len(outs) != len(rec.outs):
            return None
        found: list[int] = []
        for k, t in enumerate(outs):
            concrete = self._recorded(rec.outs[k].shape)
            if 0 in concrete:
                # an empty output holds no batch dim, and meta kernels may size it
                # otherwise (native_batch_norm's save_mean in eval: (0,) on CPU, (C,) meta)
                continue
            if t.dim() != len(concrete):
                return None
            moved = self._moved(concrete, t.shape)
            if moved is None:
                return None
            need = self.fixed.get(("o", rec.index, k))
            if need and any(t.shape[axis] != size for axis, size in need.items()):
                return None
            found += moved
        return tuple(found)

    def _recorded(self, shape: tuple[int | str, ...]) -> tuple[int, ...]:
        """A recorded shape at the recorded batch size (remembered: every try
        of a record reads its outputs' shapes)."""
        concrete = self._concrete.get(shape)
        if concrete is None:
            concrete = self._concrete[shape] = concrete_shape(shape, self.batch)
        return concrete

    def _moved(self, concrete: tuple[int, ...], shape: torch.Size) -> list[int] | None:
        """The dims of one output that went from k*B to k*(B + 1): the batch,
        or a dim merged with it (batch x time); None if any changed otherwise."""
        found: list[int] = []
        for i, (d, m) in enumerate(zip(concrete, shape, strict=True)):
            if d == m:
                continue
            if not self.strict:  # other symbols: any move (fitted and verified later)
                found.append(i)
            elif d % self.batch == 0 and m == d // self.batch * self.other:
                found.append(i)
            else:
                return None
        return found

    def resym(self, a: TArg) -> TArg:
        batch, other = self.batch, self.other
        concrete = concrete_shape(a.shape, batch)
        t = self.metas.get(a.ref)
        if t is None or a.ref[0] in ("p", "b", "c"):
            return a._replace(shape=concrete)
        if t.dim() != len(concrete):
            return a._replace(shape=concrete)
        shape = tuple(
            batch_dim(d // batch) if (d and d % batch == 0 and int(m) == d // batch * other) else d
            for d, m in zip(concrete, t.shape, strict=True)
        )
        return a._replace(shape=shape)


def _prefix_ends(shape: tuple[int, ...]) -> dict[int, int]:
    """Each prefix product of a shape and the last axis that reaches it."""
    ends: dict[int, int] = {}
    product = 1
    for axis, d in enumerate(shape):
        product *= d
        ends[product] = axis
    return ends
