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

from typing import Any

import torch

from tracelog.adapters.tape import Ref, Tape, TArg, concrete_shape, replay_tape
from tracelog.ir import batch_dim

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
_RANDOM_INPLACE = {"aten.bernoulli_.float", "aten.uniform_.default", "aten.normal_.default"}


def exact_batch_dims(tape: Tape) -> Tape | None:
    """A copy of the tape whose shapes mark exactly the batch-derived dims,
    or None when the replay could not tell."""
    batch = tape.batch_size
    if batch is None or batch < 2:
        return None
    with torch.no_grad():
        return replay_tape(tape, _MetaReplay(batch))


class _MetaReplay:
    """The tape's records run again on meta tensors whose data inputs have
    B + 1 rows instead of B: the meta tensor of each ref, and how to rerun a
    record and read which of its dims moved."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.other = batch + 1
        self.metas: dict[Ref, torch.Tensor] = {}

    def meta_of(self, a: TArg) -> torch.Tensor:
        t = self.metas.get(a.ref)
        if t is None:
            shape = list(concrete_shape(a.shape, self.batch))
            if a.ref[0] in ("i", "t") and shape:
                shape[0] = self.other  # the data's leading dim is the batch by definition
            t = torch.empty(shape, dtype=_TORCH_DTYPES[a.dtype], device="meta")
            self.metas[a.ref] = t
        return t

    def sub(self, obj: Any, chosen: set[int] | None, counter: list[int]) -> Any:
        """Replace TArgs by meta tensors, and the ints inside size lists that are
        multiples k*B of the batch, whose running position is in `chosen` (None:
        all of them), by k*(B + 1). A lone int (groups, dim, a split size) stays."""
        if isinstance(obj, TArg):
            return self.meta_of(obj)
        if isinstance(obj, tuple):
            return [self._sub_item(x, chosen, counter) for x in obj]
        if isinstance(obj, torch.device):
            return torch.device("meta")
        return obj

    def _sub_item(self, x: Any, chosen: set[int] | None, counter: list[int]) -> Any:
        """One item of a tuple argument: a batch-multiple int counts (and
        follows the batch where chosen); anything else is substituted."""
        batch = self.batch
        if type(x) is int and x > 0 and x % batch == 0:
            pos = counter[0]
            counter[0] += 1
            follow = chosen is None or pos in chosen
            return x // batch * self.other if follow else x
        return self.sub(x, chosen, counter)

    def run_with(self, rec: Any, chosen: set[int] | None) -> list[torch.Tensor]:
        counter = [0]
        args = [self.sub(a, chosen, counter) for a in rec.args]
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
        alone, and none."""
        if not rec.tainted:
            return [set()]
        n = self.n_batch_ints(rec)
        return [None] + ([{i} for i in range(n)] + [set()] if n else [])

    def store(self, ref: Ref, value: Any) -> None:
        self.metas[ref] = value

    def run(self, rec: Any) -> list[torch.Tensor] | None:
        """The replayed outputs of rec under the choice whose outputs change
        only by B -> B + 1, and of those the one that moves the earliest dims
        (the batch leads in the data); None when no choice does."""
        best: tuple[tuple[bool, tuple[int, ...]], list[torch.Tensor]] | None = None
        for chosen in self.choices(rec):
            try:
                outs = self.run_with(rec, chosen)
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
            if d % self.batch == 0 and m == d // self.batch * self.other:
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
