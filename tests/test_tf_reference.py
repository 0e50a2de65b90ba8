"""The TensorFlow float64 reference of the sample (adapters/tensorflow/reference.py):
what it differentiates, and that computing it leaves training as it was."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

import tracelog
from tracelog.sample import SAMPLE_FILE, grad_key, reference_key, scale_key

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the Keras adapter needs tensorflow-cpu")
keras = pytest.importorskip("keras", reason="the Keras adapter needs keras 3")
L = keras.layers


def _smoothed_step(log_dir: Any) -> dict[str, np.ndarray]:
    """One eager step of a Dense layer under CategoricalCrossentropy with label
    smoothing (Keras makes the smoothed labels in float32: rows summing to
    1 - 4.5e-8); returns the sample."""
    keras.backend.clear_session()  # the layer names the test reads
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), L.Dense(5)])
    loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype("float32")
    y = np.eye(5, dtype="float32")[[0, 3, 1, 4]]
    listener = tracelog.Listener(model, log_dir, strict=True)
    with listener.batch(), tf.GradientTape():
        loss(y, model(x, training=True))
    listener.close()
    return load_file(os.path.join(log_dir, SAMPLE_FILE))


def test_the_reference_differentiates_softmax_cross_entropy_as_recorded(tmp_path) -> None:
    """TensorFlow's gradient of SoftmaxCrossEntropyWithLogits is softmax - labels,
    the derivative of -sum(labels * log_softmax) only where labels sum to 1. The
    log records that sum (rules.py `_xent`) and programs differentiate it, so the
    reference must too: softmax * sum(labels) - labels."""
    sample = _smoothed_step(tmp_path / "log")
    labels = sample["target/target"].astype(np.float64)
    sums = labels.sum(-1, keepdims=True)
    assert np.abs(sums - 1).max() > 1e-8  # float32 smoothing: the case that tells them apart
    logits = sample[reference_key("output/prediction")]
    e = np.exp(logits - logits.max(-1, keepdims=True))
    softmax = e / e.sum(-1, keepdims=True)
    batch = len(labels)
    got = sample[reference_key(grad_key("sequential/dense/bias"))]
    derivative = ((softmax * sums - labels) / batch).sum(0)
    tf_gradient = ((softmax - labels) / batch).sum(0)
    assert np.abs(got - derivative).max() < 1e-15
    assert np.abs(got - tf_gradient).max() > 1e-9  # what the replay gave through TF's gradient


def test_the_emitted_programs_agree_with_the_reference_in_float64(tmp_path) -> None:
    _smoothed_step(tmp_path / "log")
    for target in ("torch", "jax"):
        report = tracelog.check(tmp_path / "log", target=target)
        assert report.ok, report.table()
        translated = [c for c in report.comparisons if c.name.endswith("[float64]")]
        assert translated and max(c.max_abs for c in translated) < 1e-14, report.table()


def _train(listen: bool, log_dir: Any) -> list[np.ndarray]:
    """Three eager steps of a model with dropout, batch norm and label smoothing
    (the reference replays the sample's dropout draw and batch-norm updates)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((6,)), L.Dense(8), L.BatchNormalization(), L.Dropout(0.3), L.Dense(5)]
    )
    loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1)
    opt = keras.optimizers.Adam(0.01)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, 6)).astype("float32")
    y = np.eye(5, dtype="float32")[rng.integers(0, 5, 12)]
    listener = tracelog.Listener(model, log_dir, strict=True) if listen else None
    for i in (0, 4, 8):
        with listener.batch() if listener else _nothing(), tf.GradientTape() as tape:
            value = loss(y[i : i + 4], model(x[i : i + 4], training=True))
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    if listener is not None:
        log = listener.close()
        assert log.sample_info is not None and log.sample_info["reference"] == "float64"
    return [v.numpy() for v in model.variables]


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_computing_the_reference_leaves_training_bitwise_unchanged(tmp_path) -> None:
    plain = _train(False, None)
    listened = _train(True, tmp_path / "log")
    assert len(plain) == len(listened)
    assert all(np.array_equal(a, b) for a, b in zip(plain, listened, strict=True))


def test_the_loss_scale_is_its_sensitivity_to_the_predictions(tmp_path) -> None:
    """scale64/loss: sum |p * dloss/dp| over the predictions, here for a mean
    squared error (dloss/dp = 2 (p - y) / n), where the check judges the loss
    (a mean of cosine similarities of either sign can be far smaller than it)."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), L.Dense(5)])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype("float32")
    y = rng.standard_normal((4, 5)).astype("float32")
    listener = tracelog.Listener(model, tmp_path / "log", strict=True)
    with listener.batch(), tf.GradientTape():
        keras.losses.MeanSquaredError()(y, model(x, training=True))
    listener.close()
    sample = load_file(os.path.join(tmp_path / "log", SAMPLE_FILE))
    p = sample[reference_key("output/prediction")]
    expected = np.abs(p * 2 * (p - y.astype(np.float64)) / p.size).sum()
    assert abs(float(sample[scale_key("loss")]) - expected) < 1e-14 * expected
