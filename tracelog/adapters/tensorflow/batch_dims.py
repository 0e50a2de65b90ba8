"""Which dims are the batch dim, for a TensorFlow tape: found by running the
recorded ops again, eagerly, with one more sample.

The equal-size guess (every dim equal to the batch size is the batch) fails
when a feature dim happens to equal it: batch 4 through a stride-2 conv on
8x8 images. So each recorded op is executed again through TensorFlow's own
``execute`` with the attributes the op callback saw, on the data grown from
B to B + 1 rows (its first row repeated: real values, so no op meets a
domain error), and a dim is the batch exactly where the two runs differ by
that change. Integer constants holding the batch size (a Reshape's target
shape built from a static shape) are tried as they are, with B replaced by
B + 1, and then with every multiple k * B replaced by k * (B + 1) (Keras'
Dense on a [B, T, F] input reshapes to [T * B, F]). If an op cannot be replayed or changes in another way,
the guess stands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tracelog.adapters.tape import Ref, Tape, TArg, concrete_shape, replay_tape
from tracelog.ir import batch_dim


def exact_batch_dims(tape: Tape, source: dict[Ref, Any]) -> Tape | None:
    """A copy of the tape whose shapes mark exactly the batch-derived dims, or
    None when the replay could not tell. ``source`` holds the tensors the
    recording saw for every ref that is not an op output (data, targets,
    parameters, buffers, constants, RNG draws)."""
    batch = tape.batch_size
    if batch is None or batch < 2:
        return None
    found = replay_tape(tape, _Replay(batch, source))
    if found is None and any(r.op == "tf.Fill" for r in tape.recs):
        # again with the Fills to constant dims that lead with the batch size
        # following it (_batch_fill): tried second, as such a dim may be a
        # sequence's length that equals the batch size by chance
        found = replay_tape(tape, _Replay(batch, source, follow_fills=True))
    return found


def _set_attrs(op_type: str, attrs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The callback's flat (name, value, ...) attrs as execute takes them: it
    reports an empty list attr (Squeeze's squeeze_dims) as None, and an unset
    one of another type too (ConvLSTM's Conv2D use_cudnn_on_gpu), which is
    left out so that its default applies."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op_type)
    kinds = {a.name: a.type for a in op_def.attr} if op_def is not None else {}
    out: list[Any] = []
    for name, value in zip(attrs[0::2], attrs[1::2], strict=True):
        if value is None:
            key = name.decode() if isinstance(name, bytes) else str(name)
            if not str(kinds.get(key, "list")).startswith("list"):
                continue
            value = []
        out += [name, value]
    return tuple(out)


class _Replay:
    """The tape's ops executed again, eagerly, on data grown from B to B + 1
    rows: each ref's grown value, and how to rerun a record and check it."""

    def __init__(self, batch: int, source: dict[Ref, Any], follow_fills: bool = False) -> None:
        import tensorflow as tf
        from tensorflow.python.eager import context, execute

        self.tf = tf
        self.execute = execute.execute
        self.ctx = context.context()
        self.batch = batch
        self.other = batch + 1
        self.source = source
        self.values: dict[Ref, Any] = {}
        self.follow_fills = follow_fills

    def grown(self, t: Any) -> Any:
        """B -> B + 1 rows, the first row repeated."""
        return self.tf.concat([t, t[:1]], axis=0)

    def value_of(self, a: TArg, follow_ints: int) -> Any:
        tf, batch = self.tf, self.batch
        kind = a.ref[0]
        if kind == "o":
            value = self.values[a.ref]
            if follow_ints and value.dtype.is_integer and len(value.shape) <= 1:
                # a shape computed from static shapes (BroadcastArgs of two
                # constants, before a BroadcastTo): followed as a constant is
                return self._batch_followed(value, follow_ints)
            return value
        if kind == "n":  # the batch size (times a.ref[3]) as a number
            k = int(a.ref[3]) if len(a.ref) > 3 else 1
            return tf.cast(tf.fill(concrete_shape(a.shape, batch), self.other * k), a.dtype)
        t = tf.convert_to_tensor(self.source[a.ref])  # a variable: its value
        if kind == "t" and len(t.shape) and t.shape[0] != batch:
            # labels flattened with the batch ([B*T] for per-step labels): k more rows
            k = int(t.shape[0]) // batch
            return self.tf.concat([t, t[:k]], axis=0)
        if kind in ("i", "t") or (kind == "r" and len(t.shape) and t.shape[0] == batch):
            return self.grown(t)
        if follow_ints and kind == "c" and t.dtype.is_integer and len(t.shape) <= 1:
            return self._batch_followed(t, follow_ints)
        return t

    def _batch_fill(self, rec: Any) -> bool:
        """A Fill to constant dims that lead with the batch size: a fill of the
        batch's rows whose size the eager code read from the data's shape
        (Keras' zero initial state of ConvLSTM, ``ops.zeros((B, ...))``), so
        its first dim follows the batch; only in the second replay
        (exact_batch_dims), after one where no Fill did failed."""
        if not self.follow_fills or rec.op != "tf.Fill" or not rec.args:
            return False
        if rec.args[0].ref[0] != "c":
            return False
        dims = np.asarray(self.source[rec.args[0].ref]).reshape(-1)
        return dims.size > 0 and int(dims[0]) == self.batch

    def _batch_followed(self, t: Any, mode: int) -> Any:
        """An integer constant with every entry equal to B replaced by B + 1
        (mode 1), every k * B by k * (B + 1) (mode 2), or only entry -1 - mode
        when it is k * B (mode < 0: Dense's [B * T, F] reshape where F is a
        multiple of B too); t itself when none is."""
        arr = t.numpy()
        b, hit = self.batch, (arr == self.batch)
        if mode == 2:
            hit = (arr > 0) & (arr % b == 0)
        elif mode < 0:
            only = np.zeros(arr.size, dtype=bool)
            if -1 - mode < arr.size:
                only[-1 - mode] = True
            hit = (arr > 0) & (arr % b == 0) & only.reshape(arr.shape)
        if not hit.any():
            return t
        return self.tf.constant(
            [
                int(v) // b * self.other if h else int(v)
                for v, h in zip(arr.reshape(-1), hit.reshape(-1), strict=True)
            ],
            dtype=t.dtype,
            shape=t.shape,
        )

    def store(self, ref: Ref, value: Any) -> None:
        self.values[ref] = value

    def run(self, rec: Any) -> list[Any] | None:
        """rec's outputs on the grown data: its integer constants as recorded,
        then (for a record whose ints involve the batch) following the batch;
        the first run whose outputs change only by B -> B + 1, else None."""
        if rec.func is None:
            return None
        if not isinstance(rec.func, tuple):  # a layer recorded whole replays itself
            return self._run_whole(rec)
        op_type, attrs = rec.func
        attrs = _set_attrs(op_type, attrs)
        # integer constants: as recorded, B -> B + 1 everywhere, k * B -> k * (B + 1),
        # then in one entry only (Conv2DBackpropInput's input_sizes [B, H, W, C]
        # where C happens to equal B)
        if rec.tainted:
            choices: tuple[int, ...] = (0, 1, 2, *(-1 - i for i in range(8)))
        else:
            choices = (-1, 0) if self._batch_fill(rec) else (0,)  # -1: the first dim alone
        for follow_ints in choices:
            try:
                inputs = [self.value_of(a, follow_ints) for a in rec.args]
                outs = self.execute(op_type, len(rec.outs), inputs, attrs, self.ctx)
            except Exception:  # this choice is wrong, or the op cannot run again
                continue
            outs = list(outs) if outs is not None else []
            if self.changes(rec, outs):
                return outs
        return None

    def _run_whole(self, rec: Any) -> list[Any] | None:
        """A record whose func is a callable of its (nested) arguments (recurrent.py)."""

        def value(a: Any) -> Any:
            if isinstance(a, TArg):
                return self.value_of(a, 0)
            return tuple(value(x) for x in a) if isinstance(a, tuple) else a

        try:
            outs = list(rec.func(*value(rec.args)))
        except Exception:  # the guess stands
            return None
        return outs if self.changes(rec, outs) else None

    def changes(self, rec: Any, outs: list[Any]) -> bool:
        """Whether every output dim is as recorded or went from k*B to k*(B + 1)."""
        batch, other = self.batch, self.other
        if len(outs) != len(rec.outs):
            return False
        for k, t in enumerate(outs):
            concrete = concrete_shape(rec.outs[k].shape, batch)
            if len(t.shape) != len(concrete):
                return False
            for d, m in zip(concrete, t.shape, strict=True):
                if d != m and not (d % batch == 0 and m == d // batch * other):
                    return False
        return True

    def resym(self, a: TArg) -> TArg:
        batch = self.batch
        concrete = concrete_shape(a.shape, batch)
        if a.ref[0] in ("p", "b", "c", "n"):
            return a._replace(shape=concrete)
        if a.ref[0] == "o":
            shape = tuple(self.values[a.ref].shape)
        elif a.ref[0] in ("i", "t"):
            lead = concrete[0] // batch * self.other if concrete else 0
            shape = (lead, *concrete[1:]) if concrete else ()
        else:
            return a  # RNG draws keep the guess
        return a._replace(
            shape=tuple(
                batch_dim(d // batch) if (d != m and d % batch == 0) else d
                for d, m in zip(concrete, shape, strict=True)
            )
        )
