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

from tracelog.adapters.symbols import Shapes, Sources, with_symbols
from tracelog.adapters.tape import Ref, Tape, TArg, concrete_shape, replay_tape
from tracelog.ir import BATCH, batch_dim

from .tensors import flatten_tensors

_TORCH_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}

# Random ops keep their input's shape; replaying them would still be shape-only,
# but they are skipped so no generator is ever touched.
_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}
_RANDOM_INPLACE = {"aten.bernoulli_.float", "aten.uniform_.default", "aten.normal_.default"}


def exact_batch_dims(tape: Tape) -> Tape | None:
    """A copy of the tape whose shapes mark exactly the batch-derived dims,
    and the dims that follow a sequence-like size of the data (symbols
    "seq", "seq2", ...), or None when the replay could not tell."""
    batch = tape.batch_size
    if batch is None or batch < 2:
        return None
    with torch.no_grad():
        batch_tape = replay_tape(tape, _MetaReplay(batch))
        if batch_tape is None:
            return None
        return with_symbols(tape, batch_tape, functools.partial(_replay_sizes, tape))


def _replay_sizes(tape: Tape, sizes: dict[str, int], sources: Sources) -> Shapes | None:
    """Every data-derived tensor's shape when the tape runs again on meta
    tensors with the symbols at `sizes`; None when a record cannot run so."""
    batch = tape.batch_size
    assert batch is not None
    replay = _MetaReplay(batch, sizes, sources)
    for a in (*tape.inputs.values(), *tape.targets):
        replay.meta_of(a)
    for rec in tape.recs:
        outs = replay.run(rec)
        if outs is None:
            return None
        for k, t in enumerate(outs):
            replay.store(("o", rec.index, k), t)
    return {ref: tuple(int(d) for d in t.shape) for ref, t in replay.metas.items()}


class _MetaReplay:
    """The tape's records run again on meta tensors whose data inputs have
    B + 1 rows instead of B (and, given `sizes`, other symbols at other
    sizes): the meta tensor of each ref, and how to rerun a record and read
    which of its dims moved."""

    def __init__(
        self, batch: int, sizes: dict[str, int] | None = None, sources: Sources | None = None
    ) -> None:
        self.batch = batch
        self.sizes = sizes if sizes is not None else {BATCH: batch + 1}
        self.other = self.sizes.get(BATCH, batch)
        self.sources = sources or {}
        # the batch alone: every moved dim must move as k*B -> k*(B + 1)
        self.strict = set(self.sizes) == {BATCH}
        self.metas: dict[Ref, torch.Tensor] = {}
        self._tainted = False  # of the record being replayed

    def meta_of(self, a: TArg) -> torch.Tensor:
        t = self.metas.get(a.ref)
        if t is None:
            shape = list(concrete_shape(a.shape, self.batch))
            if a.ref[0] in ("i", "t") and shape:
                shape[0] = self.other  # the data's leading dim is the batch by definition
            for symbol, (_size, places) in self.sources.items():
                for ref, axis in places:
                    if ref == a.ref and symbol in self.sizes:
                        shape[axis] = self.sizes[symbol]
            t = torch.empty(shape, dtype=_TORCH_DTYPES[a.dtype], device="meta")
            self.metas[a.ref] = t
        return t

    def sub(self, obj: Any, chosen: set[int] | None, counter: list[int]) -> Any:
        """Replace TArgs by meta tensors, and the ints inside size lists that are
        multiples k*B of the batch, whose running position is in `chosen` (None:
        all of them), by k*(B + 1). A lone int (groups, dim, a split size) stays,
        but for one equal to another symbol's size in a record not derived from
        the data (arange's end, a slice of a position table)."""
        if isinstance(obj, TArg):
            return self.meta_of(obj)
        if isinstance(obj, tuple):
            return [self._sub_item(x, chosen, counter) for x in obj]
        if isinstance(obj, torch.device):
            return torch.device("meta")
        if type(obj) is int and not self.strict and not self._tainted:
            new = self._lone(obj)
            if new is not None:
                return self._count(obj, new, chosen, counter)
        return obj

    @staticmethod
    def _count(x: int, new: int, chosen: set[int] | None, counter: list[int]) -> int:
        pos = counter[0]
        counter[0] += 1
        return new if chosen is None or pos in chosen else x

    def _lone(self, x: int) -> int | None:
        for symbol, size in self.sizes.items():
            if symbol != BATCH and x >= 2 and x == self.sources[symbol][0]:
                return size
        return None

    def _multiple(self, x: int) -> int | None:
        """x as k times a product of symbol sizes (the most symbols that
        divide it), at the replay's sizes; None when no symbol divides it."""
        if self.strict:
            return x // self.batch * self.other if x % self.batch == 0 else None
        base = {BATCH: self.batch, **{s: n for s, (n, _) in self.sources.items()}}
        symbols = [s for s in self.sizes if s != BATCH or self._tainted]
        for n in range(len(symbols), 0, -1):
            for group in itertools.combinations(symbols, n):
                size = math.prod(base[s] for s in group)
                if x % size == 0:
                    return x // size * math.prod(self.sizes[s] for s in group)
        return None

    def _sub_item(self, x: Any, chosen: set[int] | None, counter: list[int]) -> Any:
        """One item of a tuple argument: a batch-multiple int counts (and
        follows the batch where chosen); anything else is substituted."""
        if type(x) is int and x > 0:
            new = self._multiple(x)
            if new is not None:
                return self._count(x, new, chosen, counter)
        return self.sub(x, chosen, counter)

    def run_with(
        self, rec: Any, chosen: set[int] | None, infer: int | None = None
    ) -> list[torch.Tensor]:
        """Run rec with the chosen ints following; `infer`: the position in a
        view's size list to write as -1 (a size merged from an affine one,
        B*(T-1): the view infers it from the input)."""
        counter = [0]
        self._tainted = rec.tainted
        args = [self.sub(a, chosen, counter) for a in rec.args]
        if infer is not None:
            args[1] = [-1 if i == infer else d for i, d in enumerate(args[1])]
        kwargs = {k: self.sub(v, chosen, counter) for k, v in rec.kwargs}
        if "device" in kwargs:
            kwargs["device"] = torch.device("meta")
        if rec.op in _RANDOM_INPLACE:
            return [args[0]]
        outs: list[torch.Tensor] = []
        flatten_tensors(rec.func(*args, **kwargs), outs)
        return outs + [args[i] for i in rec.mutated]

    def n_batch_ints(self, rec: Any) -> int:
        counter = [0]
        for a in (*rec.args, *(v for _, v in rec.kwargs)):
            self.sub(a, set(), counter)
        return counter[0]

    def choices(self, rec: Any) -> list[set[int] | None]:
        """Which batch-valued ints in size lists follow the batch is ambiguous
        when a feature dim equals it (view(x, [B, B])): all of them, each
        alone, and none. Records not derived from the data (arange, full)
        may follow the other symbols only."""
        if not rec.tainted and self.strict:
            return [set()]
        n = self.n_batch_ints(rec)
        if not self.strict and 1 < n <= 4:
            # several symbols: any subset may be the one (expand(x, [B, T, 8]) with
            # B = 4 divides 8 too), the largest first
            subsets = itertools.chain.from_iterable(
                itertools.combinations(range(n), k) for k in range(n, -1, -1)
            )
            return [set(c) for c in subsets]
        return [None] + ([{i} for i in range(n)] + [set()] if n else [])

    def store(self, ref: Ref, value: Any) -> None:
        self.metas[ref] = value

    def run(self, rec: Any) -> list[torch.Tensor] | None:
        """The replayed outputs of rec under the choice whose outputs change
        only by B -> B + 1, and of those the one that moves the earliest dims
        (the batch leads in the data); None when no choice does."""
        best: tuple[tuple[bool, tuple[int, ...]], list[torch.Tensor]] | None = None
        tries: list[tuple[set[int] | None, int | None]] = [(c, None) for c in self.choices(rec)]
        if not self.strict and rec.op in _VIEWS and isinstance(rec.args[1], tuple):
            tries += [(None, i) for i in range(len(rec.args[1]))]
        for chosen, infer in tries:
            try:
                outs = self.run_with(rec, chosen, infer)
            except Exception:  # no meta kernel, or this choice is wrong
                continue
            moved = self.changes(rec, outs)
            if moved is None:
                continue
            key = (not moved, moved)
            if best is None or key < best[0]:
                best = (key, outs)
        return None if best is None else best[1]

    def changes(self, rec: Any, outs: list[torch.Tensor]) -> tuple[int, ...] | None:
        """Positions where the replay moved a dim from B to B + 1; None if it
        changed any dim some other way (then this choice, or the replay, is wrong)."""
        if len(outs) != len(rec.outs):
            return None
        found: list[int] = []
        for k, t in enumerate(outs):
            concrete = concrete_shape(rec.outs[k].shape, self.batch)
            if t.dim() != len(concrete):
                return None
            moved = self._moved(concrete, t.shape)
            if moved is None:
                return None
            found += moved
        return tuple(found)

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
            batch_dim(d // batch) if (d % batch == 0 and int(m) == d // batch * other) else d
            for d, m in zip(concrete, t.shape, strict=True)
        )
        return a._replace(shape=shape)
