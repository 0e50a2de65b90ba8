"""The TensorFlow/Keras adapter on eager GradientTape loops: Keras 3 layers
recorded as IR, deduplicated across short batches, checked against
onnx.reference, and emitted back out as PyTorch and JAX with parity."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tracelog
from tracelog.verify import verify

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the Keras adapter needs tensorflow-cpu")
keras = pytest.importorskip("keras", reason="the Keras adapter needs keras 3")


def _mlp():
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(32, activation="relu", name="fc1"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10, name="out"),
        ]
    )


def _cnn():
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, padding="same", name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.ReLU(),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, name="fc"),
        ]
    )


def _train(model, x, y, log_dir, epochs=2, batch=16):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(0.1)
    listener = tracelog.Listener(model, log_dir, strict=True)
    for _ in listener.epochs(epochs):
        for i in range(0, len(y), batch):
            with listener.batch(), tf.GradientTape() as tape:
                loss = loss_fn(y[i : i + batch], model(x[i : i + batch], training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return listener.close()


@pytest.fixture(scope="module", params=["mlp", "cnn"])
def keras_log(request, tmp_path_factory):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if request.param == "mlp":
        model, x = _mlp(), rng.random((50, 64), dtype=np.float32)
    else:
        model, x = _cnn(), rng.random((50, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, 50)
    d = tmp_path_factory.mktemp(f"keras_{request.param}")
    return request.param, d, _train(model, x, y, d)


def test_one_graph_pair_counts_every_batch(keras_log) -> None:
    kind, _, log = keras_log
    assert log.unrecorded == 0, log.failures
    rows = [(e.kind, e.phase, e.usage.batches) for e in log.entries_sorted()]
    # 4 batches per epoch (16, 16, 16, 2): the short one dedups through `batch`
    assert rows == [("prediction", "train", 8), ("loss", "train", 8)]
    pred = log.graphs[log.entries_sorted()[0].hash]
    ops = set(pred.op_histogram())
    assert "Dropout" in ops
    if kind == "cnn":
        assert {"Conv", "MaxPool", "Transpose"} <= ops
        roles = sorted(
            o.role.split("/", 1)[-1] for o in pred.outputs if o.role.startswith("update:")
        )
        assert roles == ["bn/moving_mean", "bn/moving_variance"]
    # variables by their Keras path: sequential/fc1/kernel, ...
    assert all(v.name.startswith("sequential") and v.name.count("/") == 2 for v in pred.params)


@pytest.mark.parametrize("runtime", ["reference", "onnxruntime"])
def test_ir_matches_tensorflow(keras_log, runtime: str) -> None:
    _, d, _ = keras_log
    report = verify(d, runtime=runtime)
    assert report.ok, report.table()


@pytest.mark.parametrize("target", ["torch", "jax", "onnx"])
def test_emitted_programs_match_tensorflow(keras_log, target: str) -> None:
    _, d, _ = keras_log
    report = tracelog.check(d, target=target)
    assert report.ok, report.table()
    names = [c.name for c in report.comparisons]
    if target != "onnx":
        assert any(n.startswith("grad sequential") for n in names)
    if target == "jax":  # the jitted step in float64; op by op only where asked
        assert any(n.endswith("[float64]") for n in names)
        assert not any("(no jit)" in n for n in names)


def test_a_tf_function_step_is_replayed_eagerly_and_recorded(tmp_path) -> None:
    """A traced step inside a window (tests/test_keras_tf_function.py has the
    training loop): its first batch is replayed eagerly and recorded."""
    model = _mlp()
    listener = tracelog.Listener(model, tmp_path / "log", strict=True)

    @tf.function
    def step(x):
        return model(x, training=False)

    for _ in range(2):
        with listener.batch():
            step(np.zeros((4, 64), np.float32))
    log = listener.close()
    assert log.unrecorded == 0 and log.recorded == 2
    assert [(e.kind, e.phase, e.usage.batches) for e in log.entries_sorted()] == [
        ("prediction", "eval", 2)
    ]


def test_listener_picks_the_keras_adapter_for_a_user_subclass(tmp_path) -> None:
    """A keras.Model subclass defined in user code (its class's module is the
    user's) gets the Keras listener; anything else a one-line TypeError."""
    from tracelog.adapters.tensorflow import TFListener

    class Net(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    model = Net()
    model(np.zeros((2, 4), "float32"))
    assert type(model).__module__ == __name__
    listener = tracelog.Listener(model, tmp_path / "log")
    listener.close()  # its hooks on tf.function and GradientTape go with it
    assert isinstance(listener, TFListener)
    with pytest.raises(TypeError, match="no listener for builtins.object"):
        tracelog.Listener(object(), tmp_path / "other")


def test_constant_digests_and_op_attributes_read_as_before() -> None:
    """The recorder's cached reads (issue 18: an eager step makes a few dozen
    small constants and repeats its ops' attributes every batch) give what
    reading them afresh gives: a constant's digest is sha256 over its dtype,
    shape and C-order bytes, whatever its size or layout; an op's attributes
    are its (name, value) pairs sorted, values normalised."""
    from tracelog.adapters.tensorflow.listener import _norm_attr, _op_kwargs
    from tracelog.adapters.tensorflow.tensors import tensor_digest
    from tracelog.ir import array_digest

    rng = np.random.default_rng(0)
    for value in [
        np.float32(0.99),
        np.array([1, 1, 1, 32], np.int32),
        np.array(True),
        rng.standard_normal((40, 40)).astype(np.float32),  # past the cache's size
        np.asfortranarray(rng.standard_normal((3, 5))),
    ]:
        arr = np.asarray(value)
        want = array_digest(str(arr.dtype), arr.shape, np.ascontiguousarray(arr).tobytes())
        t = tf.constant(value)
        assert tensor_digest(t) == want and tensor_digest(tf.constant(value)) == want
    assert tensor_digest(tf.constant(0.5)) != tensor_digest(tf.constant(0.25))
    assert tensor_digest(tf.constant([0.5])) != tensor_digest(tf.constant(0.5))  # shapes differ

    def fresh(attrs):  # type: ignore[no-untyped-def]
        pairs = zip(attrs[0::2], attrs[1::2], strict=True)
        return tuple(sorted((str(n), _norm_attr(v)) for n, v in pairs))

    for attrs in [
        ("T", tf.float32, "transpose_a", False, "transpose_b", True),
        ("padding", b"SAME", "strides", [1, 1, 1, 1], "T", tf.float32),  # a list: unhashable
        (),
    ]:
        assert _op_kwargs(attrs, "Op") == fresh(attrs) == _op_kwargs(attrs, "Op")
    assert _op_kwargs(("keep_dims", True), "A") == (("keep_dims", True),)
    assert _op_kwargs(("keep_dims", 1), "B") == (("keep_dims", 1),)
