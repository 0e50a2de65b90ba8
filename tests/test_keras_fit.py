"""Keras `fit` with the TracelogCallback, eager and traced: training and
validation batches recorded, and the run emitted to PyTorch with parity."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tracelog

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
pytest.importorskip("tensorflow", reason="the Keras adapter needs tensorflow-cpu")
keras = pytest.importorskip("keras", reason="the Keras adapter needs keras 3")


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


def _fit_digits_like(log_dir, *, run_eagerly: bool, jit_compile: bool = False, callback=True):
    """The same seeded run, with or without the callback; returns the final
    variables and the history."""
    from tracelog.keras import TracelogCallback

    keras.backend.clear_session()  # the same layer names in every run: the same graphs
    keras.utils.set_random_seed(0)
    model = _cnn()
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        run_eagerly=run_eagerly,
        jit_compile=jit_compile,
    )
    rng = np.random.default_rng(0)
    x, y = rng.random((100, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, 100)
    callbacks = [TracelogCallback(log_dir, strict=True)] if callback else []
    history = model.fit(
        x, y, epochs=2, batch_size=32, validation_split=0.1, verbose=0, callbacks=callbacks
    )
    return model, [v.numpy() for v in model.variables], history.history


def _rows(log):
    return [
        (e.hash, e.kind, e.phase, e.usage.batches, e.usage.epochs) for e in log.entries_sorted()
    ]


def test_fit_in_graph_mode_records_each_traced_step_and_counts_the_rest(tmp_path) -> None:
    _, plain_weights, plain_history = _fit_digits_like(None, run_eagerly=False, callback=False)
    model, weights, history = _fit_digits_like(tmp_path / "graph", run_eagerly=False)
    # the eager replay inside the traced step changes nothing the real step computes
    assert history == plain_history
    assert all(np.array_equal(a, b) for a, b in zip(weights, plain_weights, strict=True))
    graph_log = tracelog.load(tmp_path / "graph")
    assert graph_log.framework["mode"] == "graph" and graph_log.framework["run_eagerly"] is False
    assert graph_log.unrecorded == 0
    # the graphs and counts are those of the same run recorded op by op, eagerly
    _fit_digits_like(tmp_path / "eager", run_eagerly=True)
    eager_log = tracelog.load(tmp_path / "eager")
    assert _rows(graph_log) == _rows(eager_log)
    assert [r[3] for r in _rows(graph_log)] == [6, 6, 2, 2]
    report = tracelog.check(tmp_path / "graph", target="torch")
    assert report.ok, report.table()
    # the traced functions do not outlive the callback: the next fit traces anew
    assert "train_step" not in vars(model) and model.train_function is None


def test_fit_with_jit_compile_is_counted_unrecorded_with_the_reason(tmp_path) -> None:
    _fit_digits_like(tmp_path / "log", run_eagerly=False, jit_compile=True)
    log = tracelog.load(tmp_path / "log")
    assert log.framework["jit_compile"] is True
    assert log.recorded == 0 and log.unrecorded == 8
    assert "jit_compile=True" in log.failures[0]["error"]


def test_fit_on_a_dataset_with_sample_weights_and_steps_per_execution(tmp_path) -> None:
    """Several steps per traced call (the py_function sits inside Keras'
    while loop), a tf.data input with sample weights, validation_data."""
    import tensorflow as tf

    from tracelog.keras import TracelogCallback

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=2,
    )
    rng = np.random.default_rng(0)
    x, y = rng.random((50, 8), dtype=np.float32), rng.integers(0, 3, 50)
    weights = rng.random(50, dtype=np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(8)
    model.fit(
        data,
        epochs=2,
        verbose=0,
        shuffle=False,  # a dataset brings its own order
        validation_data=(x[:20], y[:20]),
        callbacks=[TracelogCallback(tmp_path / "log", strict=True)],
    )
    log = tracelog.load(tmp_path / "log")
    assert log.unrecorded == 0, log.failures
    rows = [(e.kind, e.phase, e.usage.batches) for e in log.entries_sorted()]
    # 50 samples in batches of 8: 7 per epoch; the 20 validation samples: one batch
    assert rows == [
        ("prediction", "train", 14),
        ("loss", "train", 14),
        ("prediction", "eval", 2),
        ("loss", "eval", 2),
    ]
    report = tracelog.check(tmp_path / "log", target="torch")
    assert report.ok, report.table()


def test_tracelog_keras_is_a_lazy_attribute() -> None:
    """`import tracelog` leaves TensorFlow and keras unimported; `tracelog.keras`
    then imports them on first use, and both public spellings name one class."""
    import subprocess
    import sys

    code = (
        "import sys, tracelog\n"
        "assert 'keras' not in sys.modules and 'tensorflow' not in sys.modules\n"
        "cb = tracelog.keras.TracelogCallback\n"
        "from tracelog.keras import TracelogCallback\n"
        "from tracelog.adapters.tensorflow.keras import TracelogCallback as inner\n"
        "assert cb is TracelogCallback is inner\n"
        "try:\n"
        "    tracelog.no_such_name\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('tracelog.no_such_name did not raise AttributeError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_eager_fit_builds_each_graph_once(tmp_path, monkeypatch) -> None:
    """fit(run_eagerly=True) in exact mode: train_step's work after its loss
    (the loss tracker's running total, read as a constant, then the gradient
    and the optimizer) is not recorded, so every training batch of one shape
    gives the tape of the first and its graphs are built once (they were
    built again on every batch: issue 18's exact mode)."""
    from tracelog.adapters.tensorflow import TFListener
    from tracelog.keras import TracelogCallback

    built: list[int] = []
    graphs = TFListener._graphs

    def counted(self, w):  # type: ignore[no-untyped-def]
        built.append(w.batch)
        return graphs(self, w)

    monkeypatch.setattr(TFListener, "_graphs", counted)
    keras.utils.set_random_seed(0)
    model = _cnn()
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        run_eagerly=True,
    )
    rng = np.random.default_rng(0)
    x, y = rng.random((96, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, 96)
    cb = TracelogCallback(tmp_path / "log", strict=True, mode="exact")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[cb], shuffle=False)
    log = tracelog.load(tmp_path / "log")
    assert [(e.kind, e.usage.batches, e.usage.guarded) for e in log.entries_sorted()] == [
        ("prediction", 12, 0),
        ("loss", 12, 0),
    ]
    assert built == [0]
