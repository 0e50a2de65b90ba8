"""Keras `fit` with the TracelogCallback (run_eagerly=True): training and
validation batches recorded, and the run emitted to PyTorch with parity."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tracelog

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
pytest.importorskip("tensorflow", reason="the Keras adapter needs tensorflow-cpu")
keras = pytest.importorskip("keras")


def _cnn():
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.ZeroPadding2D(1),
            keras.layers.Conv2D(4, 3, name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.ReLU(),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, name="fc"),
        ]
    )


def test_fit_records_train_and_validation_batches(tmp_path) -> None:
    from tracelog.keras import TracelogCallback

    keras.utils.set_random_seed(0)
    model = _cnn()
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        run_eagerly=True,
    )
    rng = np.random.default_rng(0)
    x, y = rng.random((100, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, 100)
    model.fit(
        x,
        y,
        epochs=2,
        batch_size=32,
        validation_split=0.1,
        verbose=0,
        callbacks=[TracelogCallback(tmp_path / "log", strict=True)],
    )
    log = tracelog.load(tmp_path / "log")
    assert log.framework["run_eagerly"] is True and log.framework["jit_compile"] is False
    rows = [(e.kind, e.phase, e.usage.batches, e.usage.epochs) for e in log.entries_sorted()]
    # 90 training samples: batches of 32, 32 and 26; 10 validation samples: one batch
    assert rows == [
        ("prediction", "train", 6, [0, 1]),
        ("loss", "train", 6, [0, 1]),
        ("prediction", "eval", 2, [0, 1]),
        ("loss", "eval", 2, [0, 1]),
    ]
    pred = log.graphs[log.entries_sorted()[0].hash]
    assert "Pad" in pred.op_histogram()
    for target in ("torch", "onnx"):
        report = tracelog.check(tmp_path / "log", target=target)
        assert report.ok, report.table()


def test_fit_in_graph_mode_is_counted_unrecorded(tmp_path) -> None:
    from tracelog.keras import TracelogCallback

    model = _cnn()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", run_eagerly=False)
    x, y = np.zeros((8, 8, 8, 1), np.float32), np.zeros(8, np.int64)
    model.fit(
        x, y, epochs=1, batch_size=4, verbose=0, callbacks=[TracelogCallback(tmp_path / "log")]
    )
    log = tracelog.load(tmp_path / "log")
    assert log.framework["mode"] == "graph"
    assert log.recorded == 0 and log.unrecorded == 2
