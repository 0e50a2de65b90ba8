"""Keras LSTM, GRU, SimpleRNN and Bidirectional, each in a small model trained for two
batches (6 and a short 4) in an eager GradientTape loop: each recurrent layer is one
ONNX LSTM / GRU / RNN node (never its time steps), one graph pair counts both batches,
the IR matches TensorFlow on onnx.reference, and the emitted PyTorch, JAX and ONNX
programs reproduce TensorFlow's predictions, loss and gradients. Masks from
Embedding(mask_zero=True) over right-padded data become ONNX sequence_lens. The
sample's float64 reference runs each recurrent layer as a float64 copy of itself
(adapters/tensorflow/reference.py), so the programs are checked in float64 too."""

from __future__ import annotations

import os
import random
import re
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

SEQ, FEATURES, VOCAB = 7, 3, 20


def _seq(*layers: Any, seq: int = SEQ) -> Any:
    return keras.Sequential([keras.Input((seq, FEATURES)), *layers])


def _tokens(*layers: Any, seq: int = SEQ) -> Any:
    """Right-padded token ids (0 is padding) through Embedding(mask_zero=True)."""
    return keras.Sequential(
        [keras.Input((seq,), dtype="int32"), L.Embedding(VOCAB, 4, mask_zero=True), *layers]
    )


def _return_state() -> Any:
    x = keras.Input((SEQ, FEATURES))
    out, h, c = L.LSTM(5, return_state=True)(x)
    both = L.Concatenate()([L.Add()([out, h]), c])
    return keras.Model(x, L.Dense(5)(both))


def _initial_state() -> Any:
    x = keras.Input((SEQ, FEATURES))
    _, h = L.GRU(5, return_state=True)(x)
    y = L.GRU(5, go_backwards=True)(x, initial_state=[h])
    return keras.Model(x, L.Dense(5)(y))


def _bidirectional_return_state() -> Any:
    x = keras.Input((SEQ, FEATURES))
    out, h_f, c_f, h_b, c_b = L.Bidirectional(L.LSTM(5, return_state=True))(x)
    return keras.Model(x, L.Dense(5)(L.Concatenate()([out, h_f, c_f, h_b, c_b])))


# name -> (model, kind of data: "real" sequences or "tokens" with padding; per-step labels)
MODELS: dict[str, tuple[Callable[[], Any], str, bool]] = {
    "LSTM": (lambda: _seq(L.LSTM(5), L.Dense(5)), "real", False),
    "LSTM_sequences": (lambda: _seq(L.LSTM(5, return_sequences=True), L.Dense(5)), "real", True),
    "LSTM_go_backwards": (
        lambda: _seq(L.LSTM(5, go_backwards=True, return_sequences=True), L.Dense(5)),
        "real",
        True,
    ),
    "LSTM_return_state": (_return_state, "real", False),
    "GRU": (lambda: _seq(L.GRU(5), L.Dense(5)), "real", False),
    "GRU_reset_before": (
        lambda: _seq(L.GRU(5, reset_after=False, return_sequences=True), L.Dense(5)),
        "real",
        True,
    ),
    "GRU_initial_state": (_initial_state, "real", False),
    "LSTM_no_bias": (lambda: _seq(L.LSTM(5, use_bias=False), L.Dense(5)), "real", False),
    "RNN_of_an_LSTMCell": (lambda: _seq(L.RNN(L.LSTMCell(5)), L.Dense(5)), "real", False),
    "SimpleRNN": (lambda: _seq(L.SimpleRNN(5), L.Dense(5)), "real", False),
    "SimpleRNN_relu_backwards": (
        lambda: _seq(L.SimpleRNN(5, activation="relu", go_backwards=True), L.Dense(5)),
        "real",
        False,
    ),
    "LSTM_stacked_masked": (
        lambda: _tokens(L.LSTM(5, return_sequences=True), L.LSTM(3), L.Dense(5)),
        "tokens",
        False,
    ),
    "GRU_masked_sequences": (
        lambda: _tokens(L.GRU(5, return_sequences=True), L.Dense(5)),
        "tokens",
        True,
    ),
    "LSTM_masked_backwards_sequences": (
        lambda: _tokens(L.LSTM(5, go_backwards=True, return_sequences=True), L.Dense(5)),
        "tokens",
        True,
    ),
    "GRU_reset_before_masked_backwards": (
        lambda: _tokens(L.GRU(5, reset_after=False, go_backwards=True), L.Dense(5)),
        "tokens",
        False,
    ),
    "Bidirectional_GRU_tagger": (
        lambda: _tokens(L.Bidirectional(L.GRU(5, return_sequences=True)), L.Dense(5)),
        "tokens",
        True,
    ),
    "Bidirectional_LSTM_last_masked": (
        lambda: _tokens(L.Bidirectional(L.LSTM(3)), L.Dense(5)),
        "tokens",
        False,
    ),
    "Bidirectional_LSTM_return_state": (_bidirectional_return_state, "real", False),
}
for _mode in ("sum", "mul", "ave"):
    MODELS[f"Bidirectional_{_mode}"] = (
        lambda m=_mode: _seq(
            L.Bidirectional(L.SimpleRNN(3, return_sequences=True), merge_mode=m), L.Dense(5)
        ),
        "real",
        True,
    )


def _data(kind: str, per_step: bool, seq: int = SEQ) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    if kind == "tokens":
        x = rng.integers(1, VOCAB, (10, seq)).astype("int32")
        lengths = rng.integers(1, seq + 1, 10)
        lengths[0] = seq  # one full row, the others padded on the right
        x[np.arange(seq)[None, :] >= lengths[:, None]] = 0
    else:
        x = rng.standard_normal((10, seq, FEATURES)).astype("float32")
    y = rng.integers(0, 5, (10, seq) if per_step else 10)
    return x, y


def _train(model: Any, x: np.ndarray, y: np.ndarray, log_dir: Any, **options: Any) -> Any:
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(0.01)
    listener = tracelog.Listener(model, log_dir, **options)
    for i in (0, 6):  # a batch of 6, then a short one of 4
        with listener.batch(), tf.GradientTape() as tape:
            value = loss(y[i : i + 6], model(x[i : i + 6], training=True))
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return listener.close()


@pytest.fixture(scope="module", params=list(MODELS), ids=list(MODELS))
def rnn_log(request, tmp_path_factory):
    make, kind, per_step = MODELS[request.param]
    keras.utils.set_random_seed(0)
    model = make()
    log_dir = tmp_path_factory.mktemp(request.param)
    x, y = _data(kind, per_step)
    return request.param, log_dir, _train(model, x, y, log_dir, strict=True)


def test_each_layer_is_one_node_and_both_batches_count_against_one_graph_pair(rnn_log) -> None:
    name, _, log = rnn_log
    assert log.unrecorded == 0, log.failures
    rows = [(e.kind, e.usage.batches) for e in log.entries_sorted()]
    assert rows == [("prediction", 2), ("loss", 2)]
    ops = log.graphs[log.entries_sorted()[0].hash].op_histogram()
    layers = 2 if ("stacked" in name or "Bidirectional" in name or "initial" in name) else 1
    assert sum(ops.get(op, 0) for op in ("LSTM", "GRU", "RNN")) == layers, ops
    assert "Unsupported" not in ops


def test_ir_matches_tensorflow(rnn_log) -> None:
    """onnx.reference (with sequence_lens, which it ignores, added by tracelog.verify)
    and onnxruntime; onnx.reference (onnx 1.23) has no relu RNN activation."""
    name, log_dir, _ = rnn_log
    for runtime in ["onnxruntime"] + ([] if "relu" in name else ["reference"]):
        report = verify(log_dir, runtime=runtime)
        assert report.ok, (runtime, report.table())


@pytest.mark.parametrize("target", ["torch", "jax", "onnx", "tensorflow"])
def test_emitted_program_matches_tensorflow(rnn_log, target: str) -> None:
    _, log_dir, _ = rnn_log
    report = tracelog.check(log_dir, target=target)
    assert report.ok, report.table()
    if target != "onnx":
        assert any(c.name.startswith("grad ") for c in report.comparisons)
        # in float64 against TensorFlow's own float64 run of the batch
        translated = [c for c in report.comparisons if c.name.endswith("[float64]")]
        assert translated and max(c.max_rel for c in translated) < 1e-12, report.table()


def test_program_size_does_not_grow_with_the_sequence_length(tmp_path) -> None:
    """The time loop stays in the node: sequences of 5 and 12 steps give programs of
    the same lines and ops (one graph pair per length)."""
    texts, hists = [], []
    for seq in (5, 12):
        keras.backend.clear_session()  # the same layer names: programs that differ in sizes only
        keras.utils.set_random_seed(0)
        model = _tokens(L.Bidirectional(L.LSTM(3, return_sequences=True)), L.GRU(4), seq=seq)
        model.add(L.Dense(5))
        x, y = _data("tokens", False, seq=seq)
        log = _train(model, x, y, tmp_path / f"seq{seq}", strict=True)
        assert len(log.entries_sorted()) == 2
        hists.append(log.graphs[log.entries_sorted()[0].hash].op_histogram())
        texts.append(tracelog.emit(tmp_path / f"seq{seq}", "torch").read_text())
    assert hists[0] == hists[1]
    assert len(texts[0].splitlines()) == len(texts[1].splitlines())

    # line for line the same program, but for the sizes in comments and the graph hashes
    def norm(line: str) -> str:
        return re.sub(r"\b(5|12)\b", "T", re.sub(r"graph [0-9a-f]{12}", "graph H", line))

    assert [norm(x) for x in texts[0].splitlines()] == [norm(x) for x in texts[1].splitlines()]


def test_only_keras_own_layers_and_cells_are_recorded_whole() -> None:
    """A subclass that overrides call, or a cell of another class, may compute something
    else: it is recorded op by op (and refused there), never taken for an LSTM."""
    from tracelog.adapters.tensorflow.recurrent import is_recurrent

    class Peephole(L.LSTM):
        def call(self, *args: Any, **kwargs: Any) -> Any:
            return super().call(*args, **kwargs) * 2.0

    class MyCell(L.GRUCell):
        pass

    assert is_recurrent(L.LSTM(3)) and is_recurrent(L.RNN(L.SimpleRNNCell(3)))
    assert not is_recurrent(Peephole(3))
    assert not is_recurrent(L.RNN(MyCell(3)))
    assert not is_recurrent(L.RNN([L.LSTMCell(3), L.LSTMCell(3)]))  # stacked cells


def test_the_float64_replay_of_a_recurrent_layer_draws_no_random_number(tmp_path) -> None:
    """The replay builds a float64 copy of the layer: seeded, zeros-initialised,
    so Python's random state (Keras' default seeds) is as the run left it."""
    keras.utils.set_random_seed(0)
    model = _seq(L.Bidirectional(L.LSTM(4, return_sequences=True)), L.GRU(3), L.Dense(5))
    x, y = _data("real", False)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    listener = tracelog.Listener(model, tmp_path / "log", strict=True)
    state = random.getstate()
    with listener.batch(), tf.GradientTape():
        loss(y[:6], model(x[:6], training=True))
    assert random.getstate() == state
    log = listener.close()
    assert log.sample_info is not None and log.sample_info["reference"] == "float64"


def test_an_inference_batch_through_dropout_layers_draws_no_extra_random_numbers(tmp_path) -> None:
    """Keras draws an RNN cell's dropout masks even in inference; the batch-dim replay
    of the layer runs it again, and must leave the seed generators as the run left them."""
    keras.utils.set_random_seed(0)
    model = _seq(L.LSTM(5, dropout=0.3, recurrent_dropout=0.2), L.Dense(5))
    seeds = [v for v in model.variables if "seed_generator" in v.path]
    x, y = _data("real", False)
    start = [v.numpy() for v in seeds]
    model(x[:6], training=False)
    expected = [v.numpy() for v in seeds]
    assert any(not np.array_equal(a, b) for a, b in zip(start, expected, strict=True))
    for v, value in zip(seeds, start, strict=True):
        v.assign(value)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    listener = tracelog.Listener(model, tmp_path / "log", strict=True)
    with listener.batch():
        loss(y[:6], model(x[:6], training=False))
    log = listener.close()
    assert log.unrecorded == 0 and [e.phase for e in log.entries_sorted()] == ["eval", "eval"]
    assert all(np.array_equal(v.numpy(), e) for v, e in zip(seeds, expected, strict=True))


def test_recurrent_dropout_in_training_is_counted_unrecorded_and_training_goes_on(
    tmp_path,
) -> None:
    keras.utils.set_random_seed(0)
    model = _seq(L.LSTM(5, recurrent_dropout=0.2), L.Dense(5))
    before = [v.numpy().copy() for v in model.trainable_variables]
    x, y = _data("real", False)
    log = _train(model, x, y, tmp_path / "log")
    assert log.unrecorded == 2
    assert {f["error"] for f in log.failures} == {
        "NotSupported: LSTM with recurrent_dropout=0.2 in training (masks drawn inside the layer)"
    }
    after = [v.numpy() for v in model.trainable_variables]
    assert any(not np.array_equal(a, b) for a, b in zip(after, before, strict=True))


def test_a_mask_that_is_not_right_padding_is_counted_unrecorded(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    model = _tokens(L.GRU(5), L.Dense(5))
    x, y = _data("tokens", False)
    x[:, 0] = 0  # left padding too
    log = _train(model, x, y, tmp_path / "log")
    assert log.unrecorded == 2
    assert {f["error"] for f in log.failures} == {
        "NotSupported: a mask that is not right padding (ONNX sequence_lens)"
    }


def _fit_tagger(log_dir: Any) -> list[np.ndarray]:
    """A seeded graph-mode fit (with the callback when log_dir is given): final weights."""
    from tracelog.keras import TracelogCallback

    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = _tokens(L.Bidirectional(L.GRU(3, return_sequences=True)), L.LSTM(4), L.Dense(5))
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        run_eagerly=False,
    )
    x, y = _data("tokens", False)
    x, y = np.concatenate([x] * 4), np.concatenate([y] * 4)
    callbacks = [TracelogCallback(log_dir)] if log_dir is not None else []
    model.fit(x, y, epochs=2, batch_size=8, verbose=0, callbacks=callbacks)
    return [v.numpy() for v in model.variables]


def test_fit_in_graph_mode_records_the_recurrent_layers_whole(tmp_path) -> None:
    plain = _fit_tagger(None)
    weights = _fit_tagger(tmp_path / "log")
    assert all(np.array_equal(a, b) for a, b in zip(plain, weights, strict=True))
    log = tracelog.load(tmp_path / "log")
    assert log.unrecorded == 0, log.failures
    assert log.sample_info is not None and log.sample_info["reference"] == "float64"
    pred = log.graphs[log.entries_sorted()[0].hash].op_histogram()
    assert pred.get("GRU") == 2 and pred.get("LSTM") == 1, pred
    for target in ("torch", "jax", "onnx"):
        report = tracelog.check(tmp_path / "log", target=target)
        assert report.ok, report.table()
