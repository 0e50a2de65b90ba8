"""tf.function inside and around a batch window: a helper the forward calls
(Keras' grouped convolution, a user's @tf.function block), a user's
@tf.function train step, the backward pass and the optimizer inside the
window, and MirroredStrategy (fit and a custom loop)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tracelog

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the Keras adapter needs tensorflow-cpu")
keras = pytest.importorskip("keras", reason="the Keras adapter needs keras 3")

TARGETS = ("torch", "jax", "onnx")


@tf.function
def _scaled_gelu(x, scale):
    """A user's @tf.function helper that a layer calls."""
    return tf.nn.gelu(x) * scale + 1.0


class _HelperLayer(keras.layers.Layer):
    def build(self, shape):
        self.scale = self.add_weight(shape=(shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        return _scaled_gelu(x, tf.convert_to_tensor(self.scale))

    def compute_output_shape(self, shape):
        return shape


def _model(helpers: bool = True):
    """Batch norm, dropout and, with ``helpers``, two tf.functions in the
    forward: Keras' grouped convolution and a user's helper."""
    functions = [
        keras.layers.Conv2D(4, 3, groups=2, name="grouped"),  # Keras' _conv_xla helper
        _HelperLayer(name="helper"),
    ]
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            *(functions if helpers else []),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, name="fc"),
        ]
    )
    assert model.built and all(layer.built for layer in model.layers)
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.random((48, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, 48)


def _weights(model, opt):
    return [v.numpy() for v in model.variables] + [v.numpy() for v in opt.variables]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))


def _rows(log):
    return [(e.kind, e.phase, e.usage.batches) for e in log.entries_sorted()]


def _eager_run(log_dir, *, span_backward: bool, epochs: int = 2, helpers: bool = True):
    """An eager GradientTape loop; the window spans the backward and the
    optimizer or stops before them."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model, (x, y) = _model(helpers), _data()
    opt = keras.optimizers.Adam(1e-2)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    listener = tracelog.Listener(model, log_dir, strict=True) if log_dir else None
    for epoch in range(epochs):
        for i in range(0, len(y), 16):
            xb, yb = x[i : i + 16], y[i : i + 16]
            window = listener.batch(epoch=epoch) if listener else _nothing()
            with window:
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb, model(xb, training=True))
                if span_backward:
                    grads = tape.gradient(loss, model.trainable_variables)
                    opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            if not span_backward:
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    log = listener.close() if listener else None
    return log, _weights(model, opt)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_a_tf_function_helper_in_the_forward_is_recorded_and_changes_nothing(tmp_path) -> None:
    log, weights = _eager_run(tmp_path / "log", span_backward=False)
    _, plain = _eager_run(None, span_backward=False)
    assert _same(weights, plain)  # the helper's real call computes training's values
    assert log.unrecorded == 0, log.failures
    assert _rows(log) == [("prediction", "train", 6), ("loss", "train", 6)]
    pred = log.graphs[log.entries_sorted()[0].hash]
    hist = pred.op_histogram()
    assert hist["Conv"] == 2 and "Erf" in hist  # the grouped conv and the helper's gelu
    for target in TARGETS:
        report = tracelog.check(tmp_path / "log", target=target)
        assert report.ok, report.table()


@pytest.mark.parametrize("helpers", [False, True])
def test_a_window_spanning_the_backward_and_the_optimizer_records_the_same_graphs(
    tmp_path, helpers
) -> None:
    short, short_w = _eager_run(tmp_path / "short", span_backward=False, helpers=helpers)
    long, long_w = _eager_run(tmp_path / "long", span_backward=True, helpers=helpers)
    assert _same(short_w, long_w)
    assert long.unrecorded == 0, long.failures
    key = [(e.hash, e.kind, e.phase, e.usage.batches) for e in long.entries_sorted()]
    assert key == [(e.hash, e.kind, e.phase, e.usage.batches) for e in short.entries_sorted()]
    for e in long.entries_sorted():
        assert "BroadcastGradientArgs" not in str(long.graphs[e.hash].op_histogram())


def _step_run(log_dir, *, jit_compile: bool = False):
    """A user's @tf.function train step over a tf.data pipeline: 3 batches of
    16 per epoch, 2 epochs."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model, (x, y) = _model(), _data()
    opt = keras.optimizers.Adam(1e-2)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=jit_compile)
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    listener = tracelog.Listener(model, log_dir, strict=True) if log_dir else None
    losses = []
    for epoch in range(2):
        for xb, yb in ds:
            if listener is None:
                losses.append(train_step(xb, yb).numpy())
                continue
            with listener.batch(epoch=epoch):
                losses.append(train_step(xb, yb).numpy())
    log = listener.close() if listener else None
    return log, _weights(model, opt), losses


def test_a_user_tf_function_step_is_recorded_counted_and_changes_nothing(tmp_path) -> None:
    log, weights, losses = _step_run(tmp_path / "log")
    _, plain, plain_losses = _step_run(None)
    assert _same(weights, plain) and _same(losses, plain_losses)
    assert log.unrecorded == 0, log.failures
    # one trace, replayed on its first batch; the 5 others counted against it
    assert _rows(log) == [("prediction", "train", 6), ("loss", "train", 6)]
    # the same graphs as the same model recorded op by op, eagerly
    eager, _ = _eager_run(tmp_path / "eager", span_backward=True)
    assert [e.hash for e in log.entries_sorted()] == [e.hash for e in eager.entries_sorted()]
    for target in TARGETS:
        report = tracelog.check(tmp_path / "log", target=target)
        assert report.ok, report.table()


def test_a_jit_compiled_step_is_counted_unrecorded_with_the_reason(tmp_path) -> None:
    log, weights, _ = _step_run(tmp_path / "log", jit_compile=True)
    _, plain, _ = _step_run(None, jit_compile=True)
    assert _same(weights, plain)
    assert log.recorded == 0 and log.unrecorded == 6
    assert "jit_compile=True" in log.failures[0]["error"]
    assert {f["phase"] for f in log.failures} == {"train"}  # the trace applies gradients


def test_convnext_tiny_is_recorded(tmp_path) -> None:
    """Its depthwise convolutions are grouped convolutions: Keras runs them in
    a jit_compile=True tf.function on the CPU, which the window follows."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = keras.applications.ConvNeXtTiny(
        weights=None, input_shape=(32, 32, 3), classes=10, classifier_activation=None
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x = np.random.default_rng(0).random((2, 32, 32, 3), dtype=np.float32)
    listener = tracelog.Listener(model, tmp_path / "log", strict=True)
    with listener.batch(), tf.GradientTape():
        loss_fn(np.array([1, 2]), model(x, training=True))
    log = listener.close()
    assert log.unrecorded == 0, log.failures
    pred = log.graphs[log.entries_sorted()[0].hash]
    assert pred.op_histogram()["Conv"] == 22  # 4 stem/downsampling + 18 depthwise
    for target in ("torch", "onnx"):  # jax passes too, in 45 s of compilation
        report = tracelog.check(tmp_path / "log", target=target)
        assert report.ok, report.table()


_MIRRORED = r"""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import numpy as np, keras, tracelog
from tracelog.keras import TracelogCallback

log_dir = sys.argv[1]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x, y = rng.random((16, 8), dtype=np.float32), rng.integers(0, 3, 16)

def mlp():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu", name="fc1"),
                             keras.layers.Dense(3, name="out")])

def rows(log):
    return [(e.kind, e.phase, e.usage.batches) for e in log.entries_sorted()]

def fit(callbacks):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = mlp()
        model.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    return [v.numpy() for v in model.variables] + [v.numpy() for v in model.optimizer.variables]

weights = fit([TracelogCallback(log_dir + "/fit", strict=True)])
same = all(np.array_equal(a, b) for a, b in zip(weights, fit([]), strict=True))
log = tracelog.load(log_dir + "/fit")
print("fit", log.unrecorded, rows(log), log.sample_info["phase"], same)

def loop(log_dir):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = mlp()
        opt = keras.optimizers.SGD(0.1)
    loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def step_fn(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_obj(yb, model(xb, training=True)),
                                              global_batch_size=8)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def dist_step(xb, yb):
        return strategy.reduce("SUM", strategy.run(step_fn, args=(xb, yb)), axis=None)

    ds = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
    listener = tracelog.Listener(model, log_dir, strict=True) if log_dir else None
    for xb, yb in ds:
        if listener is None:
            dist_step(xb, yb)
            continue
        with listener.batch():
            dist_step(xb, yb)
    log = listener.close() if listener else None
    return log, [v.numpy() for v in model.variables] + [v.numpy() for v in opt.variables]

log, weights = loop(log_dir + "/loop")
_, plain = loop(None)
same = all(np.array_equal(a, b) for a, b in zip(weights, plain, strict=True))
print("loop", log.unrecorded, rows(log), log.sample_info["phase"], same)
# the sample is one replica's batch: 4 of the global 8
print("rows", tracelog.load(log_dir + "/fit").sample()["input/x"].shape[0],
      log.sample()["input/x"].shape[0])
"""


def test_mirrored_strategy_counts_a_global_step_once(tmp_path) -> None:
    """Two logical CPUs must be set before TensorFlow initialises: a subprocess."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", _MIRRORED, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(("fit", "loop", "rows"))]
    rows = "[('prediction', 'train', 2), ('loss', 'train', 2)]"
    # two global steps of 8 on two replicas: two batches, not four
    want = [f"fit 0 {rows} train True", f"loop 0 {rows} train True", "rows 4 4"]
    assert lines == want, done.stdout
    for sub in ("fit", "loop"):
        for target in TARGETS:
            report = tracelog.check(tmp_path / sub, target=target)
            assert report.ok, report.table()
            if target != "onnx":
                assert any(c.name.startswith("grad ") for c in report.comparisons)


def test_a_tf_function_preparing_data_before_the_model_is_not_taken_for_the_step(
    tmp_path,
) -> None:
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model, (x, y) = _model(helpers=False), _data()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def prepare(xb):
        return xb * 2.0 - 1.0

    listener = tracelog.Listener(model, tmp_path / "log", strict=True)
    for i in range(0, 32, 16):
        with listener.batch(), tf.GradientTape():
            loss_fn(y[i : i + 16], model(prepare(x[i : i + 16]), training=True))
    log = listener.close()
    assert log.unrecorded == 0, log.failures
    assert _rows(log) == [("prediction", "train", 2), ("loss", "train", 2)]


def _fit(log_dir):
    from tracelog.keras import TracelogCallback

    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model, (x, y) = _model(), _data()
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    callbacks = [TracelogCallback(log_dir, strict=True)] if log_dir else []
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=callbacks)
    return [v.numpy() for v in model.variables], history.history


def test_fit_in_graph_mode_follows_the_tf_functions_of_the_forward(tmp_path) -> None:
    """The traced step's eager replay runs the nested functions op by op; the
    real step runs them as traced."""
    weights, history = _fit(tmp_path / "log")
    plain, plain_history = _fit(None)
    assert _same(weights, plain) and history == plain_history
    log = tracelog.load(tmp_path / "log")
    assert log.unrecorded == 0, log.failures
    assert _rows(log) == [("prediction", "train", 6), ("loss", "train", 6)]
    report = tracelog.check(tmp_path / "log", target="torch")
    assert report.ok, report.table()


def test_a_step_whose_eager_replay_fails_is_counted_with_the_reason(tmp_path) -> None:
    """Fail open: the replay raises (here: code that only fails eagerly), the
    real step runs as it would, every batch of that trace says why."""

    def run(log_dir):
        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        model, (x, y) = _model(helpers=False), _data()
        opt = keras.optimizers.SGD(0.1)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def train_step(xb, yb):
            if tf.executing_eagerly():
                raise ValueError("only eagerly")
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        listener = tracelog.Listener(model, log_dir) if log_dir else None
        for i in range(0, 48, 16):
            with listener.batch() if listener else _nothing():
                train_step(x[i : i + 16], y[i : i + 16])
        return (listener.close() if listener else None), _weights(model, opt)

    log, weights = run(tmp_path / "log")
    _, plain = run(None)
    assert _same(weights, plain)
    assert log.recorded == 0 and log.unrecorded == 3
    assert {f["error"] for f in log.failures} == {
        "the eager replay of the tf.function step raised ValueError: only eagerly"
    }
    assert {f["phase"] for f in log.failures} == {"train"}


def test_the_hooks_live_as_long_as_a_listener(tmp_path) -> None:
    from tensorflow.python.eager import backprop
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    call = polymorphic_function.Function.__call__
    gradient = backprop.GradientTape.gradient
    first = tracelog.Listener(_model(helpers=False), tmp_path / "a")
    second = tracelog.Listener(_model(helpers=False), tmp_path / "b")
    assert polymorphic_function.Function.__call__ is not call
    first.close()
    assert polymorphic_function.Function.__call__ is not call  # the second still listens
    second.close()
    assert polymorphic_function.Function.__call__ is call
    assert backprop.GradientTape.gradient is gradient
