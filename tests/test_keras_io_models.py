"""Keras models of the keras.io examples' kind, probed on the models matrix
(first tried 2026-11-29): what they showed, each as a small check."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracelog

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the Keras adapter needs tensorflow-cpu")
keras = pytest.importorskip("keras", reason="the Keras adapter needs keras 3")
L = keras.layers

from helpers import assert_translated  # noqa: E402

from tracelog.adapters.tensorflow.reference import _widened_attrs  # noqa: E402
from tracelog.keras import TracelogCallback  # noqa: E402


def test_unset_attribute_takes_the_op_default() -> None:
    """An attribute the callback saw unset (Conv1D's Conv2D ``use_cudnn_on_gpu``)
    is given to the float64 replay as the op def's default, since Conv2D's
    gradient function reads it; a float32 type default is widened too."""
    attrs = _widened_attrs(
        "Conv2D", (b"T", tf.float32, b"use_cudnn_on_gpu", None, b"data_format", b"NHWC")
    )
    assert dict(zip(attrs[0::2], attrs[1::2], strict=True)) == {
        b"T": tf.float64,
        b"use_cudnn_on_gpu": True,
        b"data_format": b"NHWC",
    }


def test_conv1d_text_classifier_under_fit_has_a_float64_reference(tmp_path: Path) -> None:
    """keras.io's Conv1D text classifier (Embedding, Conv1D, GlobalMaxPooling1D)
    trained by ``fit``: the float64 reference replays Conv1D's Conv2D and
    differentiates it, so the translation is judged in float64."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            L.Embedding(20, 4),
            L.Conv1D(4, 3, activation="relu"),
            L.GlobalMaxPooling1D(),
            L.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.integers(1, 20, (8, 7)).astype("int32")
    y = rng.integers(0, 2, (8, 1)).astype("float32")
    log_dir = tmp_path / "run"
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=1,
        verbose=0,
        shuffle=False,
        callbacks=[TracelogCallback(log_dir)],
    )
    report: Any = tracelog.check(log_dir, target="onnx")
    assert_translated(report)


def test_model_of_two_inputs_under_fit_takes_both_as_data(tmp_path: Path) -> None:
    """A recommender of two id inputs (``fit([users, items], y)``): the model is
    called with one list, and each tensor in it is a data input of the
    prediction graph (``x``, ``x_1``), not a constant of the recorded batch."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    users, items = keras.Input((1,), dtype="int32"), keras.Input((1,), dtype="int32")
    u = L.Flatten()(L.Embedding(6, 4)(users))
    v = L.Flatten()(L.Embedding(7, 4)(items))
    model = keras.Model([users, items], L.Activation("sigmoid")(L.Dot(axes=1)([u, v])))
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    rng = np.random.default_rng(0)
    x = [rng.integers(0, 6, (8, 1)).astype("int32"), rng.integers(0, 7, (8, 1)).astype("int32")]
    y = rng.integers(0, 2, (8, 1)).astype("float32")
    log_dir = tmp_path / "run"
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=1,
        verbose=0,
        shuffle=False,
        callbacks=[TracelogCallback(log_dir)],
    )
    log = tracelog.load(log_dir)
    pred = next(log.graph(e.hash) for e in log.entries_sorted() if e.kind == "prediction")
    assert [(v.name, v.type.shape) for v in pred.inputs] == [
        ("x", ("batch", 1)),
        ("x_1", ("batch", 1)),
    ]
    report: Any = tracelog.check(log_dir, target="torch")
    assert_translated(report)
