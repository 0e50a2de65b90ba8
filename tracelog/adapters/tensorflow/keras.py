"""Keras integration: ``model.fit(..., callbacks=[TracelogCallback("runs/x")])``.

Two ways a Keras step runs, both recorded:

- ``run_eagerly=True``: the callback opens a tracelog batch window around each
  training and validation batch and the listener sees every op as it runs.
- a traced ``tf.function`` (Keras' default): TensorFlow replays the traced
  graph without Python, so there is nothing to watch. The callback wraps
  ``train_step``/``test_step`` before Keras traces them, putting a
  ``tf.py_function`` at the head of the step. The first batch that runs each
  traced function is replayed eagerly inside it (forward and loss, no update)
  under a listener window, and every later batch of that function is counted
  against the graphs that replay recorded. The replay restores every
  non-trainable and metric variable it touched (moving statistics, dropout
  seed state), so the real step that follows draws the same dropout mask and
  training goes on bit for bit as it would without the callback.

``jit_compile=True`` steps are compiled by XLA, which cannot call back into
Python: their batches are counted unrecorded with that reason. The log
records ``run_eagerly`` and ``jit_compile`` either way.

Options are the listener's (``tracelog.adapters.torch.TorchListener`` lists
them): ``overwrite`` (a ``log_dir`` holding a log raises
``tracelog.LogExistsError`` when the callback is made, unless True),
``checkpoint_every_s``, ``checkpoint_every_batches``, ``checkpoint_weights``,
``strict``. The log reaches disk as ``fit`` goes. Keras calls no callback
when ``fit`` raises, so the callback wraps the model's train and test
functions for the length of the run: an error in a step closes the open
batch window (counted unrecorded), writes a last checkpoint and leaves the
log marked interrupted, then propagates. An error raised elsewhere (another
callback) leaves the log as of its last checkpoint, flushed at interpreter
exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import keras

from tracelog.adapters.tensorflow import TFListener
from tracelog.adapters.tensorflow.functions import functions_eagerly
from tracelog.log import claim_log_dir, holds_log

logger = logging.getLogger("tracelog")

_JIT_REASON = (
    "jit_compile=True: XLA-compiled steps cannot call back into Python; "
    "compile with jit_compile=False to record them"
)


class _TracedStep:
    """One trace of a wrapped step: what its first batch recorded."""

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.counted: tuple[str, str | None] | str | None = None


class TracelogCallback(keras.callbacks.Callback):
    def __init__(self, log_dir: str | os.PathLike[str], **options: Any) -> None:
        super().__init__()
        if not options.get("overwrite") and holds_log(log_dir):
            claim_log_dir(log_dir, False)  # raises LogExistsError before fit starts
        self.log_dir = log_dir
        self.options = options
        self._guarded: list[tuple[str, Any]] = []  # (attribute, original function)
        self.listener: TFListener | None = None
        self._open: Any = None
        self._wrapped: list[tuple[str, Any]] = []
        self._in_fit = False
        self._warned_closed = False

    # -- settings --------------------------------------------------------------------
    def _run_eagerly(self) -> bool:
        return bool(getattr(self.model, "run_eagerly", False))

    def _jit(self) -> bool:
        return bool(getattr(self.model, "jit_compile", False))

    def _graph_mode(self) -> bool:
        return not self._run_eagerly()

    def _ensure_listener(self) -> TFListener:
        if self.listener is not None and self.listener.closed and not self._warned_closed:
            self._warned_closed = True
            logger.warning(
                "tracelog: this TracelogCallback already wrote %s; "
                "use a new callback to record another run",
                self.log_dir,
            )
        if self.listener is None:
            self.listener = TFListener(self.model, self.log_dir, **self.options)
            run_eagerly = self._run_eagerly()
            self.listener.log.framework.update(
                {
                    "mode": "eager" if run_eagerly else "graph",
                    "run_eagerly": run_eagerly,
                    "jit_compile": self._jit(),
                }
            )
            if not run_eagerly:
                self.listener.log.framework["recorded_by"] = (
                    "eager replay of the first batch of each traced step"
                )
        return self.listener

    # -- the run ---------------------------------------------------------------------
    def set_model(self, model: Any) -> None:
        super().set_model(model)
        # Keras makes (and caches) its step functions right after this call:
        # the wrapped steps must be in place before it does
        if not self._run_eagerly() and not self._jit():
            self._wrap_steps()

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._in_fit = True
        self._ensure_listener()
        self._guard("train_function")
        if self._jit():
            logger.warning("tracelog: %s", _JIT_REASON)

    def on_test_begin(self, logs: dict | None = None) -> None:
        if not self._in_fit:  # model.evaluate on its own
            self._guard("test_function")

    def on_train_end(self, logs: dict | None = None) -> None:
        self._in_fit = False
        self._finish_run()

    def on_test_end(self, logs: dict | None = None) -> None:
        if not self._in_fit:  # model.evaluate on its own
            self._finish_run()

    def _finish_run(self) -> None:
        self._close_window()
        self._unguard()
        self._unwrap_steps()
        if self.listener is not None:
            self.listener.close()

    # -- a run that raises --------------------------------------------------------------
    def _guard(self, name: str) -> None:
        """Wrap the model's step function (made before on_*_begin) so that an
        error in a step ends the run's log as interrupted before it propagates."""
        original = getattr(self.model, name, None)
        if original is None or any(n == name for n, _ in self._guarded):
            return

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except BaseException as e:
                self._interrupted(e)
                raise

        setattr(self.model, name, guarded)
        self._guarded.append((name, original))

    def _unguard(self) -> None:
        for name, original in self._guarded:
            if getattr(self.model, name, None) is not None:
                setattr(self.model, name, original)
        self._guarded.clear()

    def _interrupted(self, e: BaseException) -> None:
        """The step raised: count the open batch unrecorded, write a last
        checkpoint, leave the log interrupted. Never raises over ``e``."""
        try:
            if self._open is not None:
                ctx, self._open = self._open, None
                with contextlib.suppress(BaseException):
                    ctx.__exit__(type(e), e, e.__traceback__)
            self._unguard()
            self._unwrap_steps()
            self._in_fit = False
            if self.listener is not None:
                self.listener.abandon()
        except Exception as inner:  # fail open: the user's error is the one that matters
            logger.warning("tracelog: could not end the interrupted run's log: %s", inner)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.listener is not None:
            self.listener.set_epoch(epoch)

    # -- eager batches ----------------------------------------------------------------
    def _open_window(self) -> None:
        listener = self._ensure_listener()
        self._close_window()
        if listener.closed:  # a later fit/evaluate with this callback: its log is written
            return
        self._open = listener.batch()
        self._open.__enter__()

    def _close_window(self) -> None:
        if self._open is not None:
            ctx, self._open = self._open, None
            ctx.__exit__(None, None, None)

    def _batch_begin(self) -> None:
        if not self._graph_mode():
            self._open_window()

    def _batch_end(self, phase: str) -> None:
        if not self._graph_mode():
            self._close_window()
        elif self._jit():
            self._ensure_listener().count_traced(phase, _JIT_REASON)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._batch_begin()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._batch_end("train")

    def on_test_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._batch_begin()

    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._batch_end("eval")

    # -- traced steps -----------------------------------------------------------------
    def _wrap_steps(self) -> None:
        if self._wrapped:
            return
        model = self.model
        for name, phase in (("train_step", "train"), ("test_step", "eval")):
            had_own = name in vars(model)
            original = getattr(model, name)
            setattr(model, name, self._traced_step(original, phase))
            self._wrapped.append((name, original if had_own else None))
        # step functions made before the wrap (an earlier fit) would bypass it
        model.train_function = None
        model.test_function = None

    def _unwrap_steps(self) -> None:
        if not self._wrapped:
            return
        model = self.model
        for name, original in self._wrapped:
            if original is None:
                delattr(model, name)
            else:
                setattr(model, name, original)
        self._wrapped.clear()
        # the traced functions call into this callback: later runs trace anew
        model.train_function = None
        model.test_function = None

    def _traced_step(self, original: Any, phase: str) -> Any:
        import tensorflow as tf

        def step(data: Any) -> Any:
            if tf.executing_eagerly():  # run_eagerly turned on after compile
                return original(data)
            if _replica_id() != 0:  # a global step is one batch: replica 0 records and counts
                return original(data)
            traced = _TracedStep(phase)  # this code runs once per trace
            leaves = tf.nest.flatten(data)
            where = [k for k, t in enumerate(leaves) if tf.is_tensor(t)]

            def replay_or_count(*tensors: Any) -> int:
                values = list(leaves)
                for k, t in zip(where, tensors, strict=True):
                    values[k] = t
                self._replay_or_count(traced, tf.nest.pack_sequence_as(data, values))
                return 0

            token = tf.py_function(replay_or_count, [leaves[k] for k in where], Tout=tf.int32)
            with tf.control_dependencies([token]):
                values = list(leaves)
                for k in where:
                    values[k] = tf.identity(leaves[k])
            return original(tf.nest.pack_sequence_as(data, values))

        return step

    def _replay_or_count(self, traced: _TracedStep, data: Any) -> None:
        listener = self._ensure_listener()
        if listener.closed:
            return
        if traced.counted is not None:
            listener.count_traced(traced.phase, traced.counted)
            return
        traced.counted = self._replay(listener, traced.phase, data)

    def _replay(self, listener: TFListener, phase: str, data: Any) -> tuple[str, str | None] | str:
        """Run the step's forward and loss eagerly under a listener window and
        put back every variable it changed."""
        from keras.src.trainers.data_adapters import data_adapter_utils

        model = self.model
        training = phase == "train"
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        touched = list(model.non_trainable_variables) + list(model.metrics_variables)
        saved = [(v, keras.ops.copy(v.value)) for v in touched]
        listener.last_counted = None
        try:
            # nested tf.functions (Keras' grouped convolution) run op by op here:
            # the replay is apart from the real step, which runs them as traced
            with functions_eagerly(), listener.batch():
                if getattr(model, "_call_has_training_arg", True):
                    y_pred = model(x, training=training)
                else:
                    y_pred = model(x)
                model._compute_loss(
                    x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
                )
        except Exception as e:  # fail open: the window has counted the batch unrecorded
            if listener.strict:
                raise
            logger.warning("tracelog: replay of a traced %s step failed: %s", phase, e)
        finally:
            for v, value in saved:
                v.assign(value)
        counted = listener.last_counted
        return counted if counted is not None else "the eager replay of the traced step failed"


def _replica_id() -> int:
    """The replica a step is being traced for (0 outside a distribution
    strategy): MirroredStrategy traces the step once per replica."""
    import tensorflow as tf

    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        return 0
    rid = tf.get_static_value(ctx.replica_id_in_sync_group)
    return 0 if rid is None else int(rid)


__all__ = ["TracelogCallback"]
