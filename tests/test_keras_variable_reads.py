"""Keras weights the forward reads other than by a ReadVariableOp the op
callback sees: TensorFlow's C fast path reads a variable passed to an op
directly (`tf.multiply(variable, x)`, what `self.scale * x` in Keras'
AdditiveAttention becomes). Such a read is a parameter of the graph, not a
constant of the batch; and a translation that holds a parameter the source
differentiated as a constant fails every check, on every target. A forward
that writes a trainable variable (SpectralNormalization) is refused, with
its reason, and loses nothing else."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import tracelog

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the Keras adapter needs tensorflow-cpu")
keras = pytest.importorskip("keras", reason="the Keras adapter needs keras 3")
L = keras.layers


class _Gain(L.Layer):
    """x * g + b: g read in TensorFlow's C fast path (a variable passed to
    tf.multiply as it is, as Keras' own operators on a variable pass it), b by
    a ReadVariableOp (tf.add converts its operands in Python)."""

    def build(self, shape: Any) -> None:
        self.g = self.add_weight(shape=(shape[-1],), initializer="ones", name="g")
        self.b = self.add_weight(shape=(shape[-1],), initializer="zeros", name="b")

    def call(self, x: Any) -> Any:
        return tf.add(tf.multiply(self.g.value, x), self.b.value)


def _model() -> Any:
    keras.utils.set_random_seed(0)
    x = keras.Input((6,))
    return keras.Model(x, L.Dense(3)(_Gain(name="gain")(L.Dense(8)(x))))


def _train(model: Any, log_dir: Any, batches: int = 3) -> tracelog.TraceLog:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4 * batches, 6)).astype("float32")
    y = rng.integers(0, 3, 4 * batches)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(0.1)
    listener = tracelog.Listener(model, log_dir, strict=False)
    for i in range(0, 4 * batches, 4):
        with listener.batch(), tf.GradientTape() as tape:
            value = loss(y[i : i + 4], model(x[i : i + 4], training=True))
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return listener.close()


def _params(log: tracelog.TraceLog) -> set[str]:
    return {p.name for g in log.graphs.values() for p in g.params}


def test_a_weight_read_in_c_is_a_parameter_and_trains(tmp_path) -> None:
    log = _train(_model(), tmp_path)
    assert log.unrecorded == 0, log.failures
    # the gain's weights are parameters: one graph pair for every batch, though
    # they change from batch to batch
    assert {"gain/g", "gain/b"} <= _params(log)
    assert [e.usage.batches for e in log.entries_sorted()] == [3, 3]
    for target in ("torch", "onnx"):
        report = tracelog.check(tmp_path, target=target)
        assert report.ok, report.table()
    rows = {c.name for c in tracelog.check(tmp_path, target="torch").comparisons}
    assert {"grad gain/g [float64]", "grad gain/b [float64]"} <= rows


def test_a_parameter_held_as_a_constant_fails_every_check(tmp_path, monkeypatch) -> None:
    """The reads in C not followed (as before they were): the graphs hold the
    gain's weights as constants of the batch; the check fails on each target,
    naming them, where it compared only the parameters the graphs read."""
    from tracelog.adapters.tensorflow import listener

    monkeypatch.setattr(listener._Window, "_read_in_c", lambda self, inputs, refs: refs)
    log = _train(_model(), tmp_path, batches=1)
    assert "gain/g" not in _params(log) and "gain/b" in _params(log)
    for target in ("torch", "jax", "onnx"):
        report = tracelog.check(tmp_path, target=target)
        failed = {c.name.split(" (")[0] for c in report.comparisons if not c.ok}
        assert failed >= {"grad gain/g"}, (target, report.table())


def test_a_forward_writing_a_parameter_is_refused_with_its_reason(tmp_path) -> None:
    """SpectralNormalization assigns kernel / sigma to the Dense kernel in the
    forward, and the Dense reads the written value: a parameter write-back,
    not translated. Each batch is refused, saying so; training is untouched."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), L.SpectralNormalization(L.Dense(8)), L.Dense(3)])
    log = _train(model, tmp_path, batches=2)
    assert log.unrecorded == 2 and not log.graphs
    assert "writes trainable variable" in log.failures[0]["error"], log.failures
