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
    return replay_tape(tape, _Replay(batch, source))


class _Replay:
    """The tape's ops executed again, eagerly, on data grown from B to B + 1
    rows: each ref's grown value, and how to rerun a record and check it."""

    def __init__(self, batch: int, source: dict[Ref, Any]) -> None:
        import tensorflow as tf
        from tensorflow.python.eager import context, execute

        self.tf = tf
        self.execute = execute.execute
        self.ctx = context.context()
        self.batch = batch
        self.other = batch + 1
        self.source = source
        self.values: dict[Ref, Any] = {}

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
        # the callback reports an empty list attr (Squeeze's squeeze_dims) as None
        attrs = tuple([] if v is None else v for v in attrs)
        # integer constants: as recorded, B -> B + 1 everywhere, k * B -> k * (B + 1),
        # then in one entry only (Conv2DBackpropInput's input_sizes [B, H, W, C]
        # where C happens to equal B)
        for follow_ints in (0, 1, 2, *(-1 - i for i in range(8))) if rec.tainted else (0,):
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
