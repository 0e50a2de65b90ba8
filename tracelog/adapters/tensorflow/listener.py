"""The TensorFlow/Keras listener for eager training loops (GradientTape).

An op callback (tensorflow.python.framework.op_callbacks) sees every eager op
inside a batch window. Layer calls are wrapped while the listener lives, to
know the module path of each op and where the model's forward starts and
ends. Variables are read through ReadVariableOp on their handles: parameters
(trainable) and buffers (not trainable); Keras' seed-generator state is RNG
state, and everything computed from it is the dropout mask's randomness.

Rules as in the PyTorch listener: no numerics change (the callback only
looks), fail open (an error drops that batch's record), one fingerprint per
batch and IR only for new ones. Ops built while tracing a tf.function are not
followed op by op: the listener follows the function instead
(``tracelog/adapters/tensorflow/functions.py``): a ``tf.function`` step called
inside a window is replayed eagerly on the first batch of each trace, with
every variable it touches put back, and counted against that record on later
batches; a ``tf.function`` helper the forward calls is run eagerly a second
time, on the side, and its outputs stand for the real call's. Ops run by
``GradientTape.gradient`` and every op after it (the optimizer) belong to
neither graph. ``tracelog.keras.TracelogCallback`` replays ``fit``'s traced
steps eagerly the same way.

Eager batches take the guarded fast path (``guards.py`` here, the book in
``tracelog/adapters/guards.py``): once a key gave the same graphs K exact
recordings in a row, batches with that key run with no op callback in the
forward, backward and optimizer, and are counted for those graphs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from tracelog.adapters.base import (
    LOSS_NOT_COMPUTED,
    ListenerBase,
    StateBefore,
    WindowBase,
    describe,
)
from tracelog.adapters.builder import NotSupported
from tracelog.adapters.guards import GuardBook, GuardedCounting
from tracelog.adapters.tape import Ref, Tape, TArg
from tracelog.log import TraceLog

from . import functions
from .batch_dims import exact_batch_dims
from .guards import FastWindow, input_key, op_key, static_key
from .recurrent import is_recurrent, recurrent_call
from .reference import reference64
from .rules import TF_OPS
from .tensors import dtype_name, tensor_digest, to_numpy

logger = logging.getLogger("tracelog")

# ops that only move variables around or keep TF's books
_BOOKKEEPING = {"VarHandleOp", "NoOp", "VarIsInitializedOp", "DestroyResourceOp"}
# ops whose outputs are random
_RANDOM = {
    "StatelessRandomUniformV2",
    "StatelessRandomNormalV2",
    "StatelessRandomGetKeyCounter",
    "RandomUniform",
    "RandomStandardNormal",
}


_DRAWS_AT = {
    "StatelessRandomNormalV2": ("normal", 0.0, 1.0),
    "RandomStandardNormal": ("normal", 0.0, 1.0),
    "StatelessRandomUniformV2": ("uniform", 0.0, 1.0),
    "RandomUniform": ("uniform", 0.0, 1.0),
}


def _rng_dist(
    op_type: str,
    inputs: tuple[Any, ...],
    in_refs: list[Any],
    known: dict[Ref, tuple[str, float, float]],
) -> tuple[str, float, float] | None:
    """The distribution of an op's result in the draws' arithmetic: a draw's
    own, or one scaled or shifted by a number (tf.random.stateless_normal's
    rnd * stddev + mean); None for anything else (seeds, the keep test)."""
    if op_type in _DRAWS_AT:
        return _DRAWS_AT[op_type]
    if op_type in _BELOW and len(inputs) == 2:
        return _bernoulli(op_type, inputs, in_refs, known)
    if op_type == "Cast" and in_refs and in_refs[0] in known:
        return known[in_refs[0]]  # a coin made 0.0 / 1.0 (AlphaDropout's keep mask)
    if op_type not in ("Mul", "AddV2", "Add", "Sub") or len(inputs) != 2:
        return None
    drawn = [k for k, r in enumerate(in_refs) if r is not None and r in known]
    if len(drawn) != 1:
        return None
    other = inputs[1 - drawn[0]]
    if tuple(getattr(other, "shape", (1,))) not in ((), (1,)):
        return None
    c = float(np.asarray(other).reshape(-1)[0])
    kind, a, b = known[in_refs[drawn[0]]]
    if kind == "bernoulli":
        return None  # c * coin is no coin: recorded as an op reading it (_reads_draw)
    if op_type == "Mul":
        if kind == "normal":
            return kind, a * c, b * abs(c)
        return kind, min(a * c, b * c), max(a * c, b * c)
    if op_type == "Sub" and drawn[0] == 1:
        return None  # c - draw: a reflection (not followed)
    shift = -c if op_type == "Sub" else c
    return (kind, a + shift, b) if kind == "normal" else (kind, a + shift, b + shift)


# a uniform draw compared with a number: True with the probability that it lies
# below (above) it; by the draw's side of the comparison
_BELOW = {"Less": True, "LessEqual": True, "Greater": False, "GreaterEqual": False}


def _bernoulli(
    op_type: str,
    inputs: tuple[Any, ...],
    in_refs: list[Any],
    known: dict[Ref, tuple[str, float, float]],
) -> tuple[str, float, float] | None:
    """A uniform draw's comparison with a number (Keras' RandomFlip:
    uniform <= 0.5): ("bernoulli", the probability of True, 0)."""
    drawn = [k for k, r in enumerate(in_refs) if r is not None and r in known]
    if len(drawn) != 1 or known[in_refs[drawn[0]]][0] != "uniform":
        return None
    other = inputs[1 - drawn[0]]
    if tuple(getattr(other, "shape", (1,))) not in ((), (1,)):
        return None
    c = float(np.asarray(other).reshape(-1)[0])
    _, a, b = known[in_refs[drawn[0]]]
    below = min(max((c - a) / (b - a), 0.0), 1.0) if b > a else float(c > a)
    # draw < c, or c > draw (the draw second, the comparison turned)
    return "bernoulli", below if _BELOW[op_type] == (drawn[0] == 0) else 1.0 - below, 0.0


# ops that read a tensor's shape, not its values: the targets' shape is the batch's
# (the 'n' refs follow its size), so these stay data preparation
_METADATA = {"Shape", "ShapeN", "Size", "Rank"}


def _is_seed(path: str) -> bool:
    return "seed_generator" in path


def _norm_attr(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, (list, tuple)):
        return tuple(_norm_attr(x) for x in v)
    if hasattr(v, "name") and hasattr(v, "as_numpy_dtype"):  # a tf.DType
        return str(v.name)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


# an op's attributes as the tape holds them, by its type and the attrs tuple
# TensorFlow passes (most ops of a step repeat the attributes of the step before;
# the type: an attribute's kind is the op's, and True == 1 as a key); bounded
_KWARGS: dict[tuple[Any, ...], tuple[tuple[str, Any], ...]] = {}


def _op_kwargs(attrs: Any, op_type: str = "") -> tuple[tuple[str, Any], ...]:
    if not attrs:
        return ()
    key = (op_type, attrs)
    attrs_key: tuple[Any, ...] | None = key
    try:
        found = _KWARGS.get(key)
    except TypeError:  # an unhashable value (a list): read each time
        found, attrs_key = None, None
    if found is not None:
        return found
    names, values = attrs[0::2], attrs[1::2]
    found = tuple(sorted((str(n), _norm_attr(v)) for n, v in zip(names, values, strict=True)))
    if attrs_key is not None:
        if len(_KWARGS) >= 4096:
            _KWARGS.clear()
        _KWARGS[attrs_key] = found
    return found


class _Window(WindowBase):
    """One batch window, as the op callback shows it: variable reads resolved
    to their paths, buffer assigns kept as updates, the dropout mask's
    randomness kept aside as rng refs."""

    listener: TFListener
    merged_targets = True  # per-step labels flattened by a Keras loss: [B*T] rows

    def __init__(self, listener: TFListener, epoch: int) -> None:
        # the phase is the root call's ``training`` argument; the batch index is taken at the end
        super().__init__(listener, "eval", epoch, -1)
        self.model_refs: set[Ref] = set()  # computed from data, parameters or buffers
        self.rng: dict[Ref, Any] = {}
        # a draw's distribution as followed through scalar arithmetic (_rng_dist)
        self.rng_dist: dict[Ref, tuple[str, float, float]] = {}
        self.buffer_values: dict[str, Ref] = {}
        self.inside = 0  # > 0 inside a layer recorded whole (recurrent.py): ops unrecorded
        self.private_tape: Any = None  # the sample's GradientTape, while it records
        self.tape_paused = False
        self.forward_tape: Any = None  # the sample's tape in another thread (a replica's)
        self.thread = threading.current_thread()
        self.suspended = 0  # > 0: ops run now are not the batch's (a replay's bookkeeping)
        self.done = False  # the backward ran: later ops (the optimizer) are in neither graph
        self.after_loss = False  # Keras' train step computed its loss (note_loss)
        self.step_key: str | None = None  # the traced step this window replayed
        self.counted_as: tuple[str, tuple[str, str | None] | str] | None = None
        # the guarded fast path's key of this batch (guards.py), read as a fast window reads it
        self.key_started = False
        self.keyless = False  # a replay under functions_eagerly: its key is no fast window's
        self.static: Any = None
        self.inputs: Any = None
        self.calls: list[Any] | None = None
        self.side = 0  # > 0 while a tf.function helper runs eagerly on the side
        # trainable variables the op about to be seen read in TensorFlow's C fast
        # path (tf.multiply(variable, x)): no ReadVariableOp reaches the callback
        self.c_reads: tuple[Any, ...] = ()

    def key(self) -> tuple[Any, ...] | None:
        if self.calls is None or self.keyless or self.step_key or self.counted_as:
            return None
        return (self.static, self.inputs, tuple(self.calls))

    @contextlib.contextmanager
    def suspend(self) -> Iterator[None]:
        """Ops run inside are not recorded (nor are their variable reads)."""
        self.suspended += 1
        try:
            yield
        finally:
            self.suspended -= 1

    # -- tensors ---------------------------------------------------------------------
    def dtype_of(self, t: Any) -> str:
        return dtype_name(t.dtype)

    def shape_of(self, t: Any) -> tuple[int, ...]:
        shape = getattr(t, "_shape_tuple", None)  # an eager tensor's, in one C call
        return shape() if shape is not None else tuple(t.shape)

    def is_float_scalar(self, t: Any) -> bool:
        return len(t.shape) == 0 and bool(t.dtype.is_floating)

    def digest_of(self, t: Any) -> str:
        return tensor_digest(t)

    def start_forward(self, args: Any, kwargs: Any) -> None:
        self.phase = "train" if kwargs.get("training") else "eval"
        if self.private_tape is not None and threading.current_thread() is not self.thread:
            # a MirroredStrategy replica thread runs the forward: tapes record
            # per thread, so the sample's gradients need a tape here
            tape = self.listener._tf.GradientTape(watch_accessed_variables=True)
            tape.__enter__()
            self.private_tape = self.forward_tape = tape
        super().start_forward(args, kwargs)

    def named_inputs(self, args: Any, kwargs: Any) -> list[tuple[str, Any]]:
        # a model of several inputs takes them as one list, tuple or dict
        # (``fit([users, items], y)``): each tensor in it is an input, in
        # tf.nest's order (a dict's by sorted key)
        leaves = self.listener._tf.nest.flatten(list(args))
        tensors = [a for a in leaves if hasattr(a, "dtype") and hasattr(a, "shape")]
        return [("x" if k == 0 else f"x_{k}", t) for k, t in enumerate(tensors)]

    def named_outputs(self, output: Any) -> list[tuple[str, Any]]:
        return [("prediction", output)] if hasattr(output, "dtype") else []

    def mask(self, rec_index: int) -> np.ndarray:
        rec = self.tape.recs[rec_index]
        cond = rec.args[0]
        if isinstance(cond, TArg) and cond.ref[0] == "r" and rec.op in ("tf.SelectV2", "tf.Select"):
            return to_numpy(self.rng[cond.ref]).astype(bool)  # a dropout's keep test
        # a draw the record reads as a value (tape.draws): the values drawn
        drawn = next(a for a in rec.args if isinstance(a, TArg) and a.ref in self.tape.draws)
        values = to_numpy(self.rng[drawn.ref])
        # a coin (0.0 / 1.0) is replayed as a Dropout keep mask: booleans
        return values.astype(bool) if self.tape.draws[drawn.ref][0] == "bernoulli" else values

    # -- ops --------------------------------------------------------------------------
    def on_op(self, op_type: Any, inputs: tuple, attrs: tuple, outputs: tuple, graph: Any) -> None:
        if self.suspended or self.done or self.after_loss or graph is not None:
            # graph: a tf.function being traced; the window follows its call
            # instead (functions.py), eagerly: the trace itself computes nothing
            return
        if isinstance(op_type, bytes):
            op_type = op_type.decode()
        if op_type in _BOOKKEEPING or self.inside:
            return
        if op_type == "ReadVariableOp":
            self._read_variable(inputs, outputs)
            return
        if op_type in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"):
            self._assign_variable(op_type, inputs)
            return
        region = self.region()
        if region is None:
            return
        if f"tf.{op_type}" not in TF_OPS and functions.is_function_call(op_type):
            raise NotSupported(
                f"a traced function ({op_type}) was called other than through tf.function "
                "(a ConcreteFunction called directly); its ops cannot be followed"
            )
        in_refs = self._in_refs(inputs)
        from_rng = any(r is not None and r[0] == "r" for r in in_refs)
        only_rng = not any(
            r in self.model_refs or (r is not None and r[0] in "ipbt") for r in in_refs
        )
        if op_type in _RANDOM or (
            from_rng and only_rng and not self._reads_draw(op_type, inputs, in_refs)
        ):
            # the dropout mask's randomness: seed arithmetic, uniform draws, the
            # keep test; an op that mixes it with data (SelectV2) is recorded
            self._rng_op(op_type, inputs, in_refs, outputs)
            return
        if (
            region == "post"
            and not self.from_model(inputs)
            and (op_type in _METADATA or not self.reduces_targets(inputs, outputs))
        ):
            return  # data preparation after the forward: its results meet the loss as targets
        args = tuple(self.arg(t, region) for t in inputs)
        if self.rng_dist:  # a draw was made in this window (rare): any read as a value?
            self._note_draws(in_refs)
        tainted = any(a.ref in self.taint for a in args)
        from_model = any(a.ref in self.model_refs or a.ref[0] in "ipbt" for a in args)
        kwargs = _op_kwargs(attrs, op_type)
        # func: to execute it again (adapters/tensorflow/batch_dims.py)
        index = self.record(
            f"tf.{op_type}",
            region,
            args,
            kwargs,
            list(outputs),
            len(outputs),
            tainted,
            (op_type, attrs),
        )
        if from_model:
            self.model_refs.update(("o", index, k) for k in range(len(outputs)))

    def _reads_draw(self, op_type: str, inputs: tuple, in_refs: list[Any]) -> bool:
        """An op of draws alone whose result no distribution follows, reading a
        draw of a known one (AlphaDropout's 1 - keep): recorded as an op that
        reads the draw as a value, so that the graph draws it."""
        if not self.rng_dist or not any(r in self.rng_dist for r in in_refs if r is not None):
            return False
        return _rng_dist(op_type, inputs, in_refs, self.rng_dist) is None

    def _rng_op(self, op_type: str, inputs: tuple, in_refs: list[Any], outputs: tuple) -> None:
        """An op of the draws' own arithmetic: its results are rng refs, kept
        for the sample, with their distribution where it is followed."""
        dist = _rng_dist(op_type, inputs, in_refs, self.rng_dist)
        for k, t in enumerate(outputs):
            r: Ref = ("r", len(self.rng), k)
            self.refs[id(t)] = r
            self.rng[r] = t
            self.keep.append(t)
            if dist is not None and k == 0:
                self.rng_dist[r] = dist

    def _note_draws(self, in_refs: list[Any]) -> None:
        """Draws a recorded op reads as values (x + noise): the graph draws them."""
        for ref in in_refs:
            if ref is not None and ref in self.rng_dist:
                self.tape.draws[ref] = self.rng_dist[ref]

    def _read_variable(self, inputs: tuple, outputs: tuple) -> None:
        path = self.listener._paths.get(id(inputs[0]))
        if path is None or not outputs:
            return
        self._variable_read(path, outputs[0])

    def _variable_read(self, path: str, value: Any) -> Ref:
        """`value` is what a read of the model's variable `path` gave."""
        v = self.listener._variables[path]
        ref: Ref
        if _is_seed(path):
            ref = ("r", f"seed:{path}")
        elif path in self.buffer_values:
            ref = self.buffer_values[path]  # read after an assign in this window
        else:
            ref = ("p", path) if v.trainable else ("b", path)
        self.refs[id(value)] = ref
        self.keep.append(value)
        if ref[0] == "r":
            self.rng[ref] = value
        return ref

    def _in_refs(self, inputs: tuple) -> list[Any]:
        """The refs of an op's inputs, its variables read in C among them; None
        for a tensor from outside the window."""
        in_refs = [self.refs.get(id(t)) for t in inputs]
        if self.c_reads and None in in_refs:
            return self._read_in_c(inputs, in_refs)
        return in_refs

    def _read_in_c(self, inputs: tuple, in_refs: list[Any]) -> list[Any]:
        """The op's inputs TensorFlow read from variables in C (self.c_reads,
        the variables it accessed while running: tape.VariableWatcher's list),
        each found as the one unknown input of the variable's dtype and shape
        holding its value bit for bit. Without this the graph would hold the
        weight as a constant of the batch, and the program would not train it."""
        paths = self.listener._paths
        found = list(in_refs)
        for var in self.c_reads:
            path = paths.get(id(var.handle))
            if path is None or path in self.buffer_values:
                continue  # not the model's, or an assigned value: read by Python
            with self.suspend():  # the read below is not the batch's
                value = to_numpy(var.value())
            matches = [
                k
                for k, t in enumerate(inputs)
                if found[k] is None
                and t.dtype == var.dtype
                and tuple(t.shape) == value.shape
                and np.array_equal(to_numpy(t), value, equal_nan=True)
            ]
            if len(matches) > 1:
                raise NotSupported(
                    f"an op read variable {path!r} in TensorFlow's C fast path beside "
                    "another input of the same value: which input is the variable is unknown"
                )
            if matches:
                found[matches[0]] = self._variable_read(path, inputs[matches[0]])
        return found

    def _assign_variable(self, op_type: str, inputs: tuple) -> None:
        path = self.listener._paths.get(id(inputs[0]))
        if path is None or _is_seed(path) or self.region() is None:
            return
        if self.listener._variables[path].trainable:
            # the optimizer's updates come after the backward (self.done): this
            # is the forward writing a parameter, whose reads after it take
            # the written value and give their gradient to it
            raise NotSupported(
                f"the forward writes trainable variable {path!r} (a parameter "
                "write-back, as keras.layers.SpectralNormalization's): not translated"
            )
        if op_type != "AssignVariableOp":
            raise NotSupported(f"{op_type} on a model variable")
        ref = self.refs.get(id(inputs[1]))
        if ref is not None and ref[0] == "o":
            self.buffer_values[path] = ref

    def one_value(self, t: Any) -> float | None:
        return float(to_numpy(t).reshape(-1)[0]) if int(np.prod(t.shape)) == 1 else None

    # -- the loss -----------------------------------------------------------------------
    def mark_loss(self, t: Any) -> None:
        if self.calls is not None:
            self.calls.append(("loss()",))  # as a fast window notes it
        ref = self.refs.get(id(t))
        if ref is None or ref[0] != "o":  # a variable or a data input is not a loss
            raise ValueError(LOSS_NOT_COMPUTED)
        self.explicit_loss = ref

    def note_loss(self, loss: Any) -> None:
        """The loss Keras' train step computed (a no-op for a tensor not recorded)."""
        ref = self.refs.get(id(loss))
        if ref is not None and ref[0] == "o":
            self.explicit_loss = ref
            # what train_step does next (the loss tracker's update, the loss
            # scaled, the gradient, the optimizer) is in neither graph: unrecorded,
            # so a metric's running total, a constant of every batch's tape, does
            # not make each batch's tape new (issue 18: fit(run_eagerly=True)
            # rebuilt its graphs on every batch)
            self.after_loss = True


class TFListener(GuardedCounting, ListenerBase):
    """Records the algebra of each training batch of a Keras model (TensorFlow
    backend) run eagerly: ``with listener.batch(), tf.GradientTape() as tape:``."""

    rules = TF_OPS

    def __init__(
        self,
        model: Any,
        log_dir: str | os.PathLike[str],
        *,
        mode: str = "guarded",
        guard_after: int = 3,
        rerecord_every: int = 100,
        **options: Any,
    ) -> None:
        """Options as for :class:`tracelog.adapters.torch.TorchListener`,
        ``mode``, ``guard_after`` and ``rerecord_every`` included (the guarded
        fast path of eager batches: ``guards.py``)."""
        import tensorflow as tf

        self._book = GuardBook(mode, guard_after, rerecord_every)  # a bad option raises here
        from tensorflow.python.framework import op_callbacks

        self._tf = tf
        self._op_callbacks = op_callbacks
        log = TraceLog(
            {
                "name": "tensorflow",
                "version": tf.__version__,
                "keras": _keras_version(),
                "device": "cpu" if not tf.config.list_logical_devices("GPU") else "gpu",
                "python": platform.python_version(),
                "mode": "eager",
                "notes": "Keras 3 layers as TensorFlow ops; NHWC ops recorded as NCHW ONNX ops between transposes",
            }
        )
        super().__init__(
            log,
            model,
            log_dir,
            **options,
        )
        self._variables = {v.path: v for v in model.variables}
        self._paths = {id(v.value.handle): v.path for v in model.variables}  # by handle
        self._window: _Window | FastWindow | None = None
        self._installed: list[Any] = []  # what undoes the open window's watching
        self._static: Any = None  # the static key last read, and the layers wrapped
        self._wrapped_ids: set[int] = set()
        self._no_fast = False  # a replica's forward was seen: every batch exact
        # was the last batch counted under guards (not recorded op by op)?
        self.last_guarded = False
        self._warned_guards: set[str] = set()
        self.log.recording = self._book.to_json()
        self._unwrap: list[tuple[Any, Any, str]] = []
        # traced steps seen (by concrete function name): the phase and what the
        # eager replay of its first batch counted, or why it was not recorded
        self._steps: dict[str, tuple[str, tuple[str, str | None] | str]] = {}
        functions.install()
        self._hooked = True
        layers = [model] + list(model._flatten_layers(include_self=False, recursive=True))
        for layer in layers:
            self._wrap(layer, layer is model)
        self._refresh()
        if hasattr(model, "_compute_loss"):  # Keras' train_step: the loss it differentiates
            original = model._compute_loss

            def compute_loss(*args: Any, **kwargs: Any) -> Any:
                loss = original(*args, **kwargs)
                w = self._window
                if w is not None and w.recording:
                    w.note_loss(loss)
                return loss

            model._compute_loss = compute_loss
            self._unwrap.append((model, original, "_compute_loss"))

    def _wrap(self, layer: Any, is_root: bool) -> None:
        self._wrapped_ids.add(id(layer))
        original = layer.call
        path = "" if is_root else str(getattr(layer, "path", None) or layer.name)
        tname = type(layer).__name__
        whole = recurrent_call(layer, original) if is_recurrent(layer) else None

        def call(*args: Any, **kwargs: Any) -> Any:
            w = self._window
            if w is None or not w.recording or w.suspended or w.done:
                return original(*args, **kwargs)
            if not self._tf.executing_eagerly():  # traced: the window follows the call
                return original(*args, **kwargs)
            if is_root and w.root_calls == 0 and not w.key_started:
                w = self._forward_starts(w, args, kwargs)
            if w.calls is not None and not w.side:
                w.calls.append(path)  # the key's layer calls
            if isinstance(w, FastWindow):
                return w.run(original, is_root, args, kwargs)
            if is_root:
                # NumPy data would become a tensor inside each first layer, out of
                # sight; as a tensor here (what Keras does anyway) it is the input
                args = tuple(
                    self._tf.convert_to_tensor(a) if isinstance(a, np.ndarray) else a for a in args
                )
            w.guarded(w.enter_module, path, tname, is_root, args, kwargs)
            out = original(*args, **kwargs) if whole is None else whole(w, args, kwargs)
            w.guarded(w.exit_module, is_root, out)
            return out

        layer.call = call
        self._unwrap.append((layer, original, "call"))

    # -- public API ----------------------------------------------------------------------
    def count_traced(self, phase: str, counted: tuple[str, str | None] | str) -> None:
        """Count a batch run by a traced function whose first batch was recorded
        (``counted`` is what that recording counted, or why it failed)."""
        batch = self._next_batch(phase)
        if isinstance(counted, str):
            self._count_unrecorded(phase, self.epoch, batch, counted)
        else:
            self.log.count(phase, counted[0], counted[1], self.epoch, batch)
        self._batch_counted()

    # -- the window ------------------------------------------------------------------------
    def _new_window(self) -> _Window:
        return _Window(self, self.epoch)

    def _begin_window(self) -> _Window | FastWindow:
        """A fast window where the guard book allows one (guards.py), else an
        exact window as before. The static key is read either way: a layer or
        variable added since the last window is wrapped and resolved."""
        static = self._refresh()
        book = self._book
        replay = functions.running_eagerly()  # fit's replay of a traced step
        if (
            book.mode == "guarded"
            and static is not None
            and not replay
            and not self._no_fast
            and not self._tf.distribute.has_strategy()
            and book.may_guard(static, self.epoch)
        ):
            return FastWindow(self, self.epoch, static)
        w = super()._begin_window()
        assert isinstance(w, _Window)
        w.static, w.keyless = static, replay or static is None
        return w

    def _refresh(self) -> Any:
        """The static key (None if it cannot be read); when it moved, the
        layers not wrapped yet are wrapped and the variables read again."""
        try:
            static, layers, variables = static_key(self.model)
        except Exception as e:  # fail open: no key, every batch recorded exactly
            self._warn_guards("static", "tracelog: guards not read (%s): exact mode", describe(e))
            return None
        if static != self._static:
            self._static = static
            for layer in layers:
                if id(layer) not in self._wrapped_ids:
                    self._wrap(layer, layer is self.model)
            self._variables = {v.path: v for v in variables}
            self._paths = {id(v.value.handle): v.path for v in variables}
        return static

    @contextlib.contextmanager
    def _watching(self, w: _Window | FastWindow, before: StateBefore | None) -> Iterator[None]:
        """An exact window: the op callback (``_install``); a fast window: only
        the hooks of functions.py (the recorder may be installed later, as its
        forward starts: ``_to_exact``)."""
        self._installed = []
        try:
            if isinstance(w, FastWindow):
                functions.push(w)
                self._installed.append(lambda: functions.pop(w))
                self._installed.append(w.unwatch)
            else:
                self._install(w, before)
            yield
        finally:
            installed, self._installed = self._installed, []
            for undo in reversed(installed):
                undo()

    def _install(self, w: _Window, before: StateBefore | None) -> None:
        """The op callback, and for a sampled batch a private GradientTape
        (tapes nest and change no numerics) for the sample's gradients."""
        if before is not None:
            grad_tape = before.grad_state = self._tf.GradientTape(watch_accessed_variables=True)
            grad_tape.__enter__()
            w.private_tape = grad_tape

            def close_tape() -> None:
                w.private_tape = None
                grad_tape.__exit__(None, None, None)

            self._installed.append(close_tape)

        def callback(
            op_type: Any,
            inputs: Any,
            attrs: Any,
            outputs: Any,
            op_name: Any = None,
            graph: Any = None,
        ) -> None:
            if (
                w.calls is not None
                and w.root_done
                and graph is None
                and not (w.suspended or w.done or w.side)
            ):
                w.calls.append(op_key(op_type, inputs))  # the loss's ops, as a fast window's
            if watcher and threading.get_ident() == owner:
                # the variables this op accessed (its reads in C among them); a
                # fresh watcher for the next op. Watchers are per thread: a
                # replica thread's reads in C stay unresolved
                w.c_reads = pywrap_tfe.TFE_Py_VariableWatcherWatchedVariables(watcher[0])
                if w.c_reads:
                    pywrap_tfe.TFE_Py_VariableWatcherRemove(watcher[0])
                    watcher[0] = pywrap_tfe.TFE_Py_VariableWatcherNew()
            w.guarded(w.on_op, op_type, inputs, attrs, outputs, graph)
            w.c_reads = ()
            return None

        # what tells which variables an op read in TensorFlow's C fast path
        # (trainable ones: tape.VariableWatcher's lists), where TensorFlow has it
        from tensorflow.python import pywrap_tfe

        watches = hasattr(pywrap_tfe, "TFE_Py_VariableWatcherNew")
        watcher = [pywrap_tfe.TFE_Py_VariableWatcherNew()] if watches else []
        owner = threading.get_ident()

        def unwatch() -> None:
            # removed by the thread it watches (another's set does not hold it)
            if watcher and threading.get_ident() == owner:
                pywrap_tfe.TFE_Py_VariableWatcherRemove(watcher.pop())

        self._op_callbacks.add_op_callback(callback)
        self._installed.append(unwatch)
        self._installed.append(lambda: self._op_callbacks.remove_op_callback(callback))
        functions.push(w)
        self._installed.append(lambda: functions.pop(w))

    # -- the guarded fast path -------------------------------------------------------------
    def _forward_starts(
        self, w: _Window | FastWindow, args: Any, kwargs: Any
    ) -> _Window | FastWindow:
        """The root's first call starts: read the key's inputs; a fast window
        whose inputs no trusted key starts with becomes an exact window (the
        recorder installed now: ops before the forward are never recorded,
        so nothing is lost). Then note the calls."""
        w.key_started = True
        if self._book.mode == "exact" or (isinstance(w, _Window) and w.keyless):
            return w
        if functions.in_replica_thread() or self._tf.distribute.has_strategy():
            # a replica's forward: its ops and calls are per thread, no key sees them all
            self._no_fast = True
            if isinstance(w, FastWindow):
                w.stop("a tf.distribute replica's forward in a batch counted by guards")
            else:
                w.keyless = True
            return w
        try:
            inputs = input_key(args, kwargs)
        except Exception as e:  # fail open: no key, the batch recorded exactly
            if isinstance(w, FastWindow):
                w = self._to_exact(w)
            w.keyless = True
            self._warn_guards("inputs", "tracelog: guards not read (%s)", describe(e))
            return w
        if isinstance(w, FastWindow):
            w.streak = self._book.trusted_for(w.static, inputs)
            # a training batch while the sample is due is the sample's (an
            # eval-only run, which never gives one, still takes the fast path)
            sample = self._sample is None and not self._sample_failed and kwargs.get("training")
            if w.streak is None or sample:
                w = self._to_exact(w, bool(sample))
        w.inputs = inputs
        w.calls = []
        return w

    def _to_exact(self, fw: FastWindow, sample: bool = False) -> _Window:
        """A fast window's guards failed (or it may be the sample): record the
        batch exactly from here. No variable changed since the window opened:
        the state before the forward is the batch's."""
        for undo in reversed(self._installed):
            undo()  # its functions.py entry and light callback
        self._installed = []
        w = _Window(self, fw.epoch)
        w.static, w.key_started = fw.static, True
        self._window = w
        if sample:
            w.before = self._state_before(w)
        self._install(w, w.before)
        return w

    def _fast_function(self, w: FastWindow, call: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        """A tf.function called in a fast window (functions.py): a helper the
        forward or the loss calls runs as it is (an exact window's key leaves
        its side run out too); one called before the model that uses the
        model's variables is a step, which an exact window follows."""
        if w.root_calls == 0:
            try:
                with w.suspend():
                    concrete = fn.get_concrete_function(*args, **kwargs)
                uses_model = functions.captures_model(self, concrete)
            except Exception:  # fail open: an exact window decides
                uses_model = True
            if uses_model:  # its replay may be the sample's, as in a window begun exact
                sample = self._sample is None and not self._sample_failed
                return functions.follow(self._to_exact(w, sample), call, fn, args, kwargs)
        with w.suspend():
            return call(fn, *args, **kwargs)

    def _record(self, w: Any, before: StateBefore | None) -> None:
        if isinstance(w, FastWindow):
            self._count_fast(w)
            return
        assert isinstance(w, _Window)
        if w.counted_as is None:
            super()._record(w, before)
            self._exact_counted(w, w.key())
            return
        w.phase, counted = w.counted_as  # a traced step already replayed: count it alike
        if isinstance(counted, str):
            w.stop(counted)
            return
        self.log.count(w.phase, counted[0], counted[1], w.epoch, w.batch)
        self.last_counted = counted

    def _finish(self, w: Any, before: StateBefore | None) -> None:
        self.last_guarded = False
        super()._finish(w, before)
        if isinstance(w, _Window) and not w.recording and w.key() is not None:
            self._book.not_recorded(w.static, w.inputs)  # an unrecorded batch breaks a streak
        if isinstance(w, _Window) and w.step_key is not None and self.last_counted is not None:
            self._steps[w.step_key] = (w.phase, self.last_counted)

    # -- the graphs ------------------------------------------------------------------------
    def _close_tape(self, w: _Window) -> None:
        w.tape.loss = w.loss_ref()
        for path, ref in sorted(w.buffer_values.items()):
            w.tape.buffer_updates.append((path, ref))

    def _trainable(self) -> dict[str, bool]:
        return {p: bool(v.trainable) for p, v in self._variables.items()}

    def _exact_tape(self, w: _Window) -> Tape | None:
        return exact_batch_dims(w.tape, self._sources(w))  # a replay with one more sample

    def _to_numpy(self, t: Any) -> np.ndarray:
        return to_numpy(t)

    def _sources(self, w: _Window) -> dict[Ref, Any]:
        """The tensors behind the tape's refs that are not op outputs."""
        src: dict[Ref, Any] = dict(w.rng)
        for name, t in w.input_tensors.items():
            src[("i", name)] = t
        for k, t in enumerate(w.target_tensors):
            src[("t", k)] = t
        for k, c in enumerate(w.tape.consts):
            src[("c", k)] = c.tensor
        for path, v in self._variables.items():
            src[("p" if v.trainable else "b", path)] = v.value
        return src

    # -- the sample ------------------------------------------------------------------------
    def _state_before(self, w: _Window) -> StateBefore:
        values = {p: v for p, v in self._variables.items() if not _is_seed(p)}
        return StateBefore(
            params={p: to_numpy(v.value) for p, v in values.items() if v.trainable},
            buffers={p: to_numpy(v.value) for p, v in values.items() if not v.trainable},
        )

    def _gradients(self, w: _Window, before: StateBefore, loss: Any) -> dict[str, np.ndarray]:
        trainable = [(p, v) for p, v in self._variables.items() if v.trainable]
        tape = w.forward_tape or before.grad_state
        found = tape.gradient(loss, [v.value for _, v in trainable])
        return {
            p: to_numpy(self._tf.convert_to_tensor(g))
            for (p, _), g in zip(trainable, found, strict=True)
            if g is not None
        }

    def _reference64(self, w: _Window, before: StateBefore) -> dict[str, Any] | None:
        return reference64(
            w.tape,
            sources=self._sources(w),
            params=before.params,
            buffers=before.buffers,
            trainable=[p for p, v in self._variables.items() if v.trainable],
        )

    def _grads_from(self, w: _Window) -> str:
        return "GradientTape"

    def _buffer_now(self, name: str) -> np.ndarray:
        return to_numpy(self._variables[name].value)

    # -- closing ---------------------------------------------------------------------------
    def _detach(self) -> None:
        self._count_unresolved()
        if self._hooked:
            self._hooked = False
            functions.uninstall()
        for obj, original, attr_name in self._unwrap:
            setattr(obj, attr_name, original)
        self._unwrap.clear()

    def _model_facts(self) -> dict[str, Any]:
        # read at every write of trace.json, as the guard book's counts are
        self.log.recording = self._book.to_json()
        return {
            "class": type(self.model).__name__,
            "params": [
                {
                    "name": p,
                    "dtype": str(v.dtype),
                    "shape": list(v.shape),
                    "trainable": bool(v.trainable),
                }
                for p, v in self._variables.items()
                if v.trainable
            ],
            "buffers": [
                {"name": p, "dtype": str(v.dtype), "shape": list(v.shape)}
                for p, v in self._variables.items()
                if not v.trainable and not _is_seed(p)
            ],
        }

    def _weights(self) -> dict[str, np.ndarray]:
        return {p: to_numpy(v.value) for p, v in self._variables.items() if not _is_seed(p)}


def _keras_version() -> str:
    try:
        import keras

        return str(keras.__version__)
    except ImportError:  # pragma: no cover
        return ""
