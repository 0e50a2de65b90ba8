"""The Keras rows of ``benchmarks/recording_overhead.py`` (``--models
keras_tape,keras_fit_eager,keras_fit``): a small Keras CNN, the same contexts,
interleaved step by step in one run.

- ``keras_tape``: an eager GradientTape loop (forward, loss and gradient in
  the window; the optimizer after it, timed too);
- ``keras_fit_eager``: ``fit(run_eagerly=True)`` with ``TracelogCallback``;
- ``keras_fit``: ``fit`` as Keras runs it by default (a traced step: tracelog
  replays the first batch of each trace eagerly and counts the rest from a
  ``tf.py_function``; ``mode`` does not apply, so "tracelog exact" is the same).

Contexts: ``floor`` is an empty op callback (``op_callbacks.add_op_callback``,
the mechanism the listener records with) for the step; ``profiler`` is
``tf.profiler.experimental`` tracing the step (start and stop outside the
timed step, as torch.profiler's session is). Each fit runs in its own thread,
which waits its turn at each batch's end: one step of one context at a time.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import threading
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_callbacks

from tracelog.adapters.tensorflow import TFListener
from tracelog.keras import TracelogCallback

MODELS = {
    "keras_tape": "Keras CNN, GradientTape, batch 32",
    "keras_fit_eager": "Keras CNN, fit(run_eagerly), b 32",
    "keras_fit": "Keras CNN, fit (traced), batch 32",
}
_LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def one_thread() -> None:
    """A shared machine: keep the contexts comparable (before TF starts)."""
    with contextlib.suppress(RuntimeError):  # TF already initialised
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def cnn() -> keras.Model:
    """Two conv + batch-norm blocks on 3x16x16 images, dropout, a dense head."""
    keras.utils.set_random_seed(0)
    L = keras.layers
    return keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            L.Conv2D(32, 3, padding="same"),
            L.BatchNormalization(),
            L.ReLU(),
            L.Conv2D(32, 3, padding="same"),
            L.BatchNormalization(),
            L.ReLU(),
            L.MaxPooling2D(),
            L.Flatten(),
            L.Dropout(0.25),
            L.Dense(10),
        ]
    )


def _data() -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    x = rng.random((32, 16, 16, 3), dtype=np.float32)
    return tf.constant(x), tf.constant(rng.integers(0, 10, 32))


def _empty_callback(*args: Any, **kwargs: Any) -> None:
    return None


class _Profiled:
    """A tf.profiler session around one step (its start and stop not timed)."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    def start(self) -> None:
        tf.profiler.experimental.start(self.log_dir)

    def stop(self) -> None:
        tf.profiler.experimental.stop()


class TapeArm:
    """One context of the GradientTape loop: its own model, optimizer, listener."""

    def __init__(self, name: str, log_dir: str, rerecord_every: int) -> None:
        self.name = name
        self.model = cnn()
        self.opt = keras.optimizers.SGD(1e-3)
        self.x, self.y = _data()
        self.listener: Any = None
        if name.startswith("tracelog"):
            mode = "exact" if name.endswith("exact") else "guarded"
            self.listener = TFListener(
                self.model, log_dir, mode=mode, rerecord_every=rerecord_every
            )
        self.profiler = _Profiled(log_dir) if name == "profiler" else None
        self.times: list[float] = []

    def _window(self) -> Any:
        return self.listener.batch() if self.listener is not None else contextlib.nullcontext()

    def step(self, timed: bool) -> None:
        if self.profiler is not None:
            self.profiler.start()
        start = time.perf_counter()
        if self.name == "floor":
            op_callbacks.add_op_callback(_empty_callback)
        try:
            with self._window():
                with tf.GradientTape() as tape:
                    loss = _LOSS(self.y, self.model(self.x, training=True))
                grads = tape.gradient(loss, self.model.trainable_variables)
            self.opt.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        finally:
            if self.name == "floor":
                op_callbacks.remove_op_callback(_empty_callback)
        if timed:
            self.times.append(time.perf_counter() - start)
        if self.profiler is not None:
            self.profiler.stop()

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()


class _Turns(keras.callbacks.Callback):
    """The first and last callback of a fit arm: times each batch (from the
    first callback's batch start to the last's batch end) and waits its turn."""

    def __init__(self, arm: FitArm, first: bool) -> None:
        super().__init__()
        self.arm, self.first = arm, first

    def on_train_begin(self, logs: Any = None) -> None:
        if self.first:
            self.arm.go.acquire()

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.first:
            self.arm.begin()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if not self.first:
            self.arm.end()


class FitArm:
    """One context of ``fit``, in a thread of its own that runs one batch per turn."""

    def __init__(
        self, name: str, log_dir: str, rerecord_every: int, eager: bool, total: int
    ) -> None:
        self.name = name
        self.model = cnn()
        self.model.compile(optimizer=keras.optimizers.SGD(1e-3), loss=_LOSS, run_eagerly=eager)
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)
        self.profiler = _Profiled(log_dir) if name == "profiler" else None
        self.times: list[float] = []
        self.timed = False
        self.error: BaseException | None = None
        self._start = 0.0
        callbacks: list[Any] = [_Turns(self, True)]
        if name.startswith("tracelog"):
            mode = "exact" if name.endswith("exact") else "guarded"
            callbacks.append(TracelogCallback(log_dir, mode=mode, rerecord_every=rerecord_every))
        callbacks.append(_Turns(self, False))
        x, y = _data()
        data = tf.data.Dataset.from_tensors((x, y)).repeat()
        self.thread = threading.Thread(target=self._fit, args=(data, total, callbacks), daemon=True)
        self.thread.start()

    def _fit(self, data: Any, total: int, callbacks: list[Any]) -> None:
        try:
            self.model.fit(data, steps_per_epoch=total, epochs=1, verbose=0, callbacks=callbacks)
        except BaseException as e:  # the main thread re-raises it
            self.error = e
            self.done.release()

    def begin(self) -> None:
        if self.profiler is not None:
            self.profiler.start()
        if self.name == "floor":
            op_callbacks.add_op_callback(_empty_callback)  # thread-local: this fit's thread
        self._start = time.perf_counter()

    def end(self) -> None:
        elapsed = time.perf_counter() - self._start
        if self.name == "floor":
            op_callbacks.remove_op_callback(_empty_callback)
        if self.profiler is not None:
            self.profiler.stop()
        if self.timed:
            self.times.append(elapsed)
        self.done.release()
        self.go.acquire()  # Keras' work up to the next batch runs in the next turn, untimed

    def step(self, timed: bool) -> None:
        self.timed = timed
        self.go.release()
        self.done.acquire()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.go.release()  # the last batch's end waits for a turn that ends the fit
        self.thread.join()


def measure(
    key: str, contexts: list[str], rounds: int, steps: int, rerecord_every: int
) -> tuple[str, dict[str, list[float]]]:
    """One Keras row: times per context, as ``recording_overhead.measure``."""
    warm = 5
    with tempfile.TemporaryDirectory() as d:
        arms: list[Any]
        if key == "keras_tape":
            arms = [TapeArm(c, f"{d}/{i}", rerecord_every) for i, c in enumerate(contexts)]
        else:
            total = warm + rounds * steps
            eager = key == "keras_fit_eager"
            arms = [
                FitArm(c, f"{d}/{i}", rerecord_every, eager, total) for i, c in enumerate(contexts)
            ]
        try:
            for (
                arm
            ) in arms:  # warm-up: steps traced, graphs built, the sample taken, guards trusted
                for _ in range(warm):
                    arm.step(timed=False)
            shuffle = random.Random(0)
            for _ in range(rounds):
                for arm in shuffle.sample(arms, len(arms)):
                    for _ in range(steps):
                        arm.step(timed=True)
        finally:
            for arm in arms:
                arm.close()
        return MODELS[key], {arm.name: arm.times for arm in arms}
