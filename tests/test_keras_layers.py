"""Every Keras 3 layer, activation and loss the Keras direction covers, each in
a small model trained for two batches (6 and a short 4) in an eager
GradientTape loop: one graph pair counts both batches (exact batch dims),
the IR matches TensorFlow on onnx.reference, and the emitted PyTorch, JAX
and ONNX programs reproduce TensorFlow's predictions, loss and gradients."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tracelog
from tracelog.verify import verify

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the Keras adapter needs tensorflow-cpu")
keras = pytest.importorskip("keras", reason="the Keras adapter needs keras 3")
L = keras.layers


def _img(*layers: Any, shape: tuple[int, ...] = (8, 8, 3)) -> Any:
    return keras.Sequential([keras.Input(shape), *layers])


def _head() -> list[Any]:
    return [L.GlobalAveragePooling2D(), L.Dense(5)]


def _concat_add() -> Any:
    x = keras.Input((8, 8, 3))
    a = L.Conv2D(4, 3, padding="same")(x)
    b = L.Conv2D(4, 1)(x)
    h = L.Concatenate()([L.Concatenate()([a, b]), L.Add()([a, b])])
    return keras.Model(x, L.Dense(5)(L.GlobalAveragePooling2D()(h)))


def _attention() -> Any:
    x = keras.Input((6, 8))
    h = L.MultiHeadAttention(num_heads=2, key_dim=4)(x, x)
    h = L.LayerNormalization()(L.Add()([x, h]))
    return keras.Model(x, L.Dense(5)(L.Flatten()(h)))


LAYERS: dict[str, Callable[[], Any]] = {
    "Dense": lambda: _img(L.Flatten(), L.Dense(5)),
    "Conv2D": lambda: _img(L.Conv2D(4, 3, strides=2, padding="same"), *_head()),
    "DepthwiseConv2D": lambda: _img(L.DepthwiseConv2D(3, depth_multiplier=2), *_head()),
    "SeparableConv2D": lambda: _img(L.SeparableConv2D(6, 3, padding="same"), *_head()),
    "BatchNormalization": lambda: _img(L.Conv2D(4, 1), L.BatchNormalization(), *_head()),
    "MaxPooling2D": lambda: _img(L.MaxPooling2D(3, 2, padding="same"), L.Flatten(), L.Dense(5)),
    "AveragePooling2D": lambda: _img(L.AveragePooling2D(2), L.Flatten(), L.Dense(5)),
    "AveragePooling2D_same": lambda: _img(
        L.AveragePooling2D(3, 2, padding="same"), L.Flatten(), L.Dense(5)
    ),
    "GlobalAveragePooling2D": lambda: _img(L.Conv2D(4, 1), *_head()),
    "Reshape_Flatten": lambda: _img(L.Reshape((16, 12)), L.Flatten(), L.Dense(5)),
    "Concatenate_Add": _concat_add,
    "Dropout": lambda: _img(L.Flatten(), L.Dropout(0.3), L.Dense(5)),
    "ZeroPadding2D": lambda: _img(L.ZeroPadding2D(1), L.Conv2D(2, 3), *_head()),
    "Embedding": lambda: keras.Sequential(
        [
            keras.Input((7,), dtype="int32"),
            L.Embedding(20, 8),
            L.GlobalAveragePooling1D(),
            L.Dense(5),
        ]
    ),
    "LayerNormalization": lambda: keras.Sequential(
        [keras.Input((6, 8)), L.LayerNormalization(), L.Flatten(), L.Dense(5)]
    ),
    "MultiHeadAttention": _attention,
}
for _act in ("relu", "relu6", "gelu", "swish", "sigmoid", "tanh", "softmax"):
    LAYERS[f"activation_{_act}"] = lambda a=_act: _img(
        L.Flatten(), L.Dense(8), L.Activation(a), L.Dense(5)
    )

# loss -> (loss, activation on the model's output, kind of target)
LOSSES: dict[str, tuple[Callable[[], Any], str | None, str]] = {
    "SparseCCE_logits": (
        lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        None,
        "sparse",
    ),
    "SparseCCE_probabilities": (keras.losses.SparseCategoricalCrossentropy, "softmax", "sparse"),
    "CCE_logits": (
        lambda: keras.losses.CategoricalCrossentropy(from_logits=True),
        None,
        "onehot",
    ),
    "CCE_probabilities": (keras.losses.CategoricalCrossentropy, "softmax", "onehot"),
    "MeanSquaredError": (keras.losses.MeanSquaredError, None, "real"),
    "BinaryCrossentropy": (keras.losses.BinaryCrossentropy, "sigmoid", "binary"),
    "BinaryCrossentropy_logits": (
        lambda: keras.losses.BinaryCrossentropy(from_logits=True),
        None,
        "binary",
    ),
}


def _record(model: Any, loss: Any, kind: str, log_dir: Any) -> tracelog.TraceLog:
    rng = np.random.default_rng(0)
    shape = tuple(model.inputs[0].shape[1:])
    if str(model.inputs[0].dtype).startswith("int"):
        x = rng.integers(0, 20, (10, *shape)).astype("int32")
    else:
        x = rng.standard_normal((10, *shape)).astype("float32")
    y = {
        "sparse": lambda: rng.integers(0, 5, 10),
        "onehot": lambda: np.eye(5, dtype="float32")[rng.integers(0, 5, 10)],
        "binary": lambda: rng.integers(0, 2, (10, 5)).astype("float32"),
        "real": lambda: rng.standard_normal((10, 5)).astype("float32"),
    }[kind]()
    opt = keras.optimizers.SGD(0.01)
    listener = tracelog.Listener(model, log_dir, strict=True)
    for i in (0, 6):  # a batch of 6, then a short one of 4
        with listener.batch(), tf.GradientTape() as tape:
            value = loss(y[i : i + 6], model(x[i : i + 6], training=True))
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return listener.close()


CASES = [(f"layer_{n}", n) for n in LAYERS] + [(f"loss_{n}", n) for n in LOSSES]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def layer_log(request, tmp_path_factory):
    case, name = request.param
    keras.utils.set_random_seed(0)
    if case.startswith("loss_"):
        make_loss, activation, kind = LOSSES[name]
        model = _img(L.Flatten(), L.Dense(5), *([L.Activation(activation)] if activation else []))
        loss = make_loss()
    else:
        model = LAYERS[name]()
        loss, kind = keras.losses.SparseCategoricalCrossentropy(from_logits=True), "sparse"
    log_dir = tmp_path_factory.mktemp(case)
    return log_dir, _record(model, loss, kind, log_dir)


def test_both_batches_count_against_one_graph_pair(layer_log) -> None:
    _, log = layer_log
    assert log.unrecorded == 0, log.failures
    rows = [(e.kind, e.usage.batches) for e in log.entries_sorted()]
    assert rows == [("prediction", 2), ("loss", 2)]


def test_ir_matches_tensorflow(layer_log) -> None:
    log_dir, _ = layer_log
    report = verify(log_dir, runtime="reference")
    assert report.ok, report.table()


@pytest.mark.parametrize("target", ["torch", "jax", "onnx"])
def test_emitted_program_matches_tensorflow(layer_log, target: str) -> None:
    log_dir, _ = layer_log
    report = tracelog.check(log_dir, target=target)
    assert report.ok, report.table()
    if target != "onnx":
        assert any(c.name.startswith("grad ") for c in report.comparisons)


def test_channels_first_layout_keeps_transposes_only_at_the_edges(layer_log) -> None:
    """For PyTorch and JAX the NHWC recording runs NCHW inside: what stays is
    the data entering (after a ZeroPadding2D on the input, if any), and values
    leaving for a flatten or reshape."""
    from tracelog.passes.layout import to_channels_first

    _, log = layer_log
    for e in log.entries_sorted():
        graph, report = to_channels_first(log.graphs[e.hash])
        entering = [
            w
            for w in report.kept
            if w.startswith("data input x enters NHWC") or w.startswith("into NCHW after Pad")
        ]
        leaving = [w for w in report.kept if w.startswith("back to NHWC for Reshape")]
        assert len(entering) <= 1 and len(entering) + len(leaving) == len(
            report.kept
        ), report.summary()
