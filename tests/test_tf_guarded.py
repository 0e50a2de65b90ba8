"""Issue 18, TensorFlow side: the guarded fast path of eager Keras loops
(GradientTape, ``fit(run_eagerly=True)``). Once a batch's key gave the same
graphs K exact recordings in a row, later batches with that key run with no
op callback and are counted for those graphs; counts must match exact
mode's, training must not change, and trace.json and ``tracelog show`` say
which batches were counted how."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracelog
from tracelog.cli import show_text

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the Keras adapter needs tensorflow-cpu")
keras = pytest.importorskip("keras", reason="the Keras adapter needs keras 3")


def _Listener(model: Any, log_dir: Path, **options: Any) -> Any:
    """The TF listener itself: ``tracelog.Listener`` picks a listener by the
    model class's module, which for a Model subclassed here is not keras'."""
    from tracelog.adapters.tensorflow import TFListener

    return TFListener(model, log_dir, **options)


class _Net(keras.Model):
    """An MLP whose call can take a data-dependent branch (another layer on
    batches with large inputs), use a layer added later, and scale its output
    by a plain attribute (a constant of the graph the guards cannot see)."""

    def __init__(self, branchy: bool = False) -> None:
        super().__init__()
        self.fc1 = keras.layers.Dense(16, activation="relu", name="fc1")
        self.extra = keras.layers.Dense(16, activation="relu", name="extra")
        self.out = keras.layers.Dense(4, name="out")
        self.branchy = branchy
        self.bonus: Any = None
        self.scale = 1.0

    def build(self, input_shape: Any) -> None:
        self.fc1.build(input_shape)
        self.extra.build((None, 16))
        self.out.build((None, 16))

    def call(self, x: Any, training: bool = False) -> Any:
        h = self.fc1(x)
        if self.branchy and float(tf.reduce_max(tf.abs(x))) > 10:
            h = self.extra(h)
        if self.bonus is not None:
            h = self.bonus(h)
        return self.out(h) * self.scale


def _net(branchy: bool = False) -> _Net:
    keras.backend.clear_session()  # the same layer names in every run
    keras.utils.set_random_seed(0)
    model = _Net(branchy)
    model(np.zeros((2, 8), np.float32))
    return model


def _batches(n: int, big: frozenset[int] = frozenset()) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        x = rng.standard_normal((6, 8)).astype(np.float32)
        out.append((x * 100 if i in big else x, rng.integers(0, 4, 6)))
    return out


_LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _step(
    listener: Any, model: Any, opt: Any, x: Any, y: Any, training: bool = True, loss_fn: Any = _LOSS
) -> bool:
    with listener.batch(), tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=training))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return bool(listener.last_guarded)


def _train(
    log_dir: Path, epochs: int = 2, per_epoch: int = 12, big: frozenset[int] = frozenset(), **o: Any
) -> tracelog.TraceLog:
    model = _net(branchy=bool(big))
    opt = keras.optimizers.SGD(0.01)
    with _Listener(model, log_dir, strict=True, **o) as listener:
        for _ in listener.epochs(epochs):
            for x, y in _batches(per_epoch, big):
                _step(listener, model, opt, x, y)
    return tracelog.load(log_dir)


def _rows(log: tracelog.TraceLog) -> list[tuple[Any, ...]]:
    return [
        (e.hash, e.kind, e.phase, e.usage.batches, e.usage.epochs, e.usage.first, e.usage.last)
        for e in log.entries_sorted()
    ]


def test_trace_json_and_show_say_exact_and_guarded(tmp_path: Path) -> None:
    log = _train(tmp_path / "g", guard_after=3, rerecord_every=5)
    trace = json.loads((tmp_path / "g" / "trace.json").read_text())
    # epoch 0: exact 0-2 (K), guarded 3-6, exact 7, guarded 8-11; epoch 1:
    # exact 0 (its first), guarded 1-4, exact 5, guarded 6-9, exact 10, guarded 11
    for e in trace["entries"]:
        assert (e["batches"], e["exact"], e["guarded"]) == (24, 7, 17)
    rec = trace["recording"]
    assert (rec["mode"], rec["exact"], rec["guarded"], rec["branches"]) == ("guarded", 7, 17, 0)
    assert rec["switched_to_exact"] is None
    lines = show_text(log, "g").splitlines()
    assert lines[1].split()[5:8] == ["batches", "exact", "guarded"]
    assert lines[2].split()[5:8] == ["24", "7", "17"]


def test_bad_options_raise_before_training(tmp_path: Path) -> None:
    for options in ({"mode": "fast"}, {"guard_after": 0}, {"rerecord_every": 1}):
        with pytest.raises(ValueError):
            _Listener(_net(), tmp_path / "x", **options)
    assert not (tmp_path / "x").exists()


def _digits_style(log_dir: Path | None, **options: Any) -> tuple[list[np.ndarray], Any]:
    """The README's loop in Keras: a CNN with batch norm and dropout, train
    batches with a short last one, eval batches (training=False, no
    gradient), three epochs."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, padding="same", name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.ReLU(name="relu"),
            keras.layers.MaxPooling2D(name="pool"),
            keras.layers.Flatten(name="flat"),
            keras.layers.Dropout(0.25, name="drop"),
            keras.layers.Dense(10, name="fc"),
        ]
    )
    rng = np.random.default_rng(3)
    x_tr, y_tr = rng.random((70, 8, 8, 1), np.float32), rng.integers(0, 10, 70)
    x_te, y_te = rng.random((24, 8, 8, 1), np.float32), rng.integers(0, 10, 24)
    opt = keras.optimizers.Adam(1e-2)
    listener = _Listener(model, log_dir, strict=True, **options) if log_dir else None
    for epoch in range(3):
        if listener:
            listener.set_epoch(epoch)
        for i in range(0, 70, 16):
            with listener.batch() if listener else _nothing(), tf.GradientTape() as tape:
                loss = _LOSS(y_tr[i : i + 16], model(x_tr[i : i + 16], training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        for i in range(0, 24, 8):
            with listener.batch() if listener else _nothing():
                _LOSS(y_te[i : i + 8], model(x_te[i : i + 8], training=False))
    if listener:
        listener.close()
    return [v.numpy() for v in model.variables], tracelog.load(log_dir) if log_dir else None


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_digits_style_counts_equal_and_weights_bitwise(tmp_path: Path) -> None:
    bare, _ = _digits_style(None)
    exact_w, exact = _digits_style(tmp_path / "e", mode="exact")
    guarded_w, guarded = _digits_style(tmp_path / "g", guard_after=2, rerecord_every=4)
    assert _rows(exact) == _rows(guarded)
    assert [e.usage.batches for e in exact.entries_sorted()] == [15, 15, 9, 9]
    assert exact.unrecorded == guarded.unrecorded == 0
    assert all(e.usage.guarded == 0 for e in exact.entries.values())
    assert all(e.usage.guarded > 0 for e in guarded.entries.values())
    for a, b, c in zip(bare, exact_w, guarded_w, strict=True):  # training is not perturbed
        assert np.array_equal(a, b) and np.array_equal(a, c)
    assert guarded.sample_info == exact.sample_info  # the sample: an exact recording
    assert (tmp_path / "g" / "sample.safetensors").read_bytes() == (
        tmp_path / "e" / "sample.safetensors"
    ).read_bytes()


def _seq() -> Any:
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu", name="fc1"),
            keras.layers.Dense(4, name="out"),
        ]
    )


@pytest.mark.parametrize(
    "change", ["shape", "training_false", "new_layer", "lora", "loss", "policy"]
)
def test_each_change_leaves_the_fast_path(tmp_path: Path, change: str) -> None:
    model = _seq()
    opt = keras.optimizers.SGD(0.01)
    (x, y), *_ = _batches(1)
    with _Listener(model, tmp_path / "g", strict=True) as listener:
        assert [_step(listener, model, opt, x, y) for _ in range(5)] == [False] * 3 + [True] * 2
        training, loss_fn = True, _LOSS
        if change == "shape":
            x, y = x[:5], y[:5]
        elif change == "training_false":
            training = False
        elif change == "new_layer":
            bonus = keras.layers.Dense(4, name="bonus")
            bonus.build((None, 4))
            model.add(bonus)
        elif change == "lora":  # new variables on a built layer: lora_kernel_a and _b
            model.get_layer("out").enable_lora(2)
        elif change == "loss":  # the loss's ops are part of the key
            loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
        if change in ("new_layer", "lora"):
            opt = keras.optimizers.SGD(0.01)  # one that knows the new variables
        try:
            if change == "policy":
                keras.config.set_dtype_policy("mixed_float16")
            guarded = _step(listener, model, opt, x, y, training, loss_fn)
        finally:
            keras.config.set_dtype_policy("float32")
        assert not guarded
        assert listener.log.unrecorded == 0, listener.log.failures
    log = tracelog.load(tmp_path / "g")
    assert all(e.usage.batches >= 1 for e in log.entries.values())
    params = {p.name for g in log.graphs.values() for p in g.params}
    new = {"new_layer": "bonus/kernel", "lora": "sequential/out/lora_kernel_a"}.get(change)
    if new is not None:  # the new variable is resolved: a parameter of the graphs
        assert new in params, params


def test_a_data_dependent_branch_is_counted_right(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    big = frozenset({6, 8, 10})  # guarded batches by then (K=3): the guarded run meets each unseen
    exact = _train(tmp_path / "e", big=big, mode="exact")
    with caplog.at_level(logging.WARNING, logger="tracelog"):
        guarded = _train(tmp_path / "g", big=big)
    assert len(exact.graphs) == 3  # two predictions, one loss
    assert _rows(exact) == _rows(guarded)
    assert guarded.unrecorded == exact.unrecorded == 0
    rec = guarded.recording
    assert rec is not None and rec["branches"] >= 1 and rec["switched_to_exact"] is None
    first = rec["branch_batches"][0]
    assert (first["epoch"], first["batch"], first["known"]) == (0, 6, False)
    assert any("data-dependent branch" in r.getMessage() for r in caplog.records)
    assert sum(e.usage.guarded for e in guarded.entries.values()) > 0


def test_a_branch_never_recorded_exactly_is_counted_unrecorded(tmp_path: Path) -> None:
    log = _train(tmp_path / "g", epochs=1, per_epoch=10, big=frozenset({5}))
    assert log.unrecorded == 1 and "data-dependent branch" in log.failures[0]["error"]
    assert log.failures[0]["batch"] == 5
    assert [e.usage.batches for e in log.entries_sorted()] == [9, 9]


def test_a_change_the_guards_cannot_see_switches_to_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = _net()
    opt = keras.optimizers.SGD(0.01)
    with caplog.at_level(logging.WARNING, logger="tracelog"):
        with _Listener(model, tmp_path / "g", strict=True, rerecord_every=4) as listener:
            for i, (x, y) in enumerate(_batches(14)):
                if i == 5:
                    model.scale = 2.0  # the graph's constant changes: same key
                guarded = _step(listener, model, opt, x, y)
                if i > 6:
                    assert not guarded  # exact from the switch on
    log = tracelog.load(tmp_path / "g")
    switched = log.recording["switched_to_exact"]
    assert switched is not None and switched["batch"] == 6  # the next exact re-recording
    assert switched["guarded_before"] == 3
    assert any("recorded exactly from here on" in r.getMessage() for r in caplog.records)
    preds = [e.usage for e in log.entries_sorted() if e.kind == "prediction"]
    assert log.recorded == 14 and [(u.batches, u.guarded) for u in preds] == [(6, 3), (8, 0)]


def test_fit_run_eagerly_guarded_counts_equal_exact(tmp_path: Path) -> None:
    from tracelog.keras import TracelogCallback

    def run(log_dir: Path, **options: Any) -> tuple[tracelog.TraceLog, list[np.ndarray]]:
        model = _net()
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss=_LOSS, run_eagerly=True)
        rng = np.random.default_rng(2)
        x, y = rng.standard_normal((60, 8)).astype(np.float32), rng.integers(0, 4, 60)
        model.fit(
            x,
            y,
            batch_size=8,
            epochs=2,
            validation_data=(x[:16], y[:16]),
            verbose=0,
            shuffle=False,
            callbacks=[TracelogCallback(log_dir, strict=True, **options)],
        )
        return tracelog.load(log_dir), [v.numpy() for v in model.variables]

    exact, exact_w = run(tmp_path / "e", mode="exact")
    guarded, guarded_w = run(tmp_path / "g")
    assert _rows(exact) == _rows(guarded) and exact.unrecorded == guarded.unrecorded == 0
    assert [e.usage.batches for e in exact.entries_sorted()] == [16, 16, 4, 4]
    assert sum(e.usage.guarded for e in guarded.entries.values()) > 0
    assert all(np.array_equal(a, b) for a, b in zip(exact_w, guarded_w, strict=True))


def test_guards_that_fail_never_break_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail open: keys that cannot be read leave every batch recorded exactly."""
    import tracelog.adapters.tensorflow.listener as tf_listener

    def broken(*args: Any) -> Any:
        raise RuntimeError("no key today")

    model = _seq()
    opt = keras.optimizers.SGD(0.01)
    (x, y), *_ = _batches(1)
    with _Listener(model, tmp_path / "g") as listener:
        assert [_step(listener, model, opt, x, y) for _ in range(4)] == [False] * 3 + [True]
        monkeypatch.setattr(tf_listener, "input_key", broken)
        assert [_step(listener, model, opt, x, y) for _ in range(3)] == [False] * 3
        monkeypatch.setattr(tf_listener, "static_key", broken)
        assert [_step(listener, model, opt, x, y) for _ in range(3)] == [False] * 3
    log = tracelog.load(tmp_path / "g")
    assert log.unrecorded == 0 and [e.usage.batches for e in log.entries_sorted()] == [10, 10]


def test_an_eval_only_run_is_guarded_and_a_later_training_batch_is_the_sample(
    tmp_path: Path,
) -> None:
    def run(log_dir: Path, **options: Any) -> list[bool]:
        model = _seq()
        opt = keras.optimizers.SGD(0.01)
        (x, y), *_ = _batches(1)
        with _Listener(model, log_dir, strict=True, **options) as listener:
            guarded = []
            for _ in range(5):  # evaluation: no sample to take, the fast path after K
                with listener.batch():
                    _LOSS(y, model(x, training=False))
                guarded.append(listener.last_guarded)
            assert not _step(listener, model, opt, x, y)  # the first training batch: exact
        return guarded

    assert run(tmp_path / "e", mode="exact") == [False] * 5
    assert run(tmp_path / "g") == [False] * 3 + [True] * 2
    # its sample, recorded from its forward on (gradients from a tape begun there), is exact mode's
    assert (tmp_path / "g" / "sample.safetensors").read_bytes() == (
        tmp_path / "e" / "sample.safetensors"
    ).read_bytes()
    log = tracelog.load(tmp_path / "g")
    assert log.sample_info is not None and log.sample_info["phase"] == "train"
    assert log.sample_info["batch"] == 0 and log.unrecorded == 0
    assert [(e.phase, e.usage.batches) for e in log.entries_sorted()] == [
        ("train", 1),
        ("train", 1),
        ("eval", 5),
        ("eval", 5),
    ]


def test_a_tf_function_step_in_a_fast_window_is_followed(tmp_path: Path) -> None:
    """Eval batches trusted, then a ``@tf.function`` training step: its window
    opens fast, and the step (called before the model runs eagerly) is
    followed as in an exact window: replayed once, then counted; the replay
    is the sample's."""
    model = _seq()
    opt = keras.optimizers.SGD(0.01)
    (x, y), *_ = _batches(1)
    x, y = tf.constant(x), tf.constant(y)

    @tf.function
    def train_step(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = _LOSS(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    with _Listener(model, tmp_path / "g", strict=True) as listener:
        for _ in range(4):
            with listener.batch():
                _LOSS(y, model(x, training=False))
        assert listener.last_guarded
        for _ in range(3):
            with listener.batch():
                train_step(x, y)
            assert not listener.last_guarded
    log = tracelog.load(tmp_path / "g")
    assert log.unrecorded == 0, log.failures
    assert [(e.phase, e.usage.batches) for e in log.entries_sorted()] == [
        ("train", 3),
        ("train", 3),
        ("eval", 4),
        ("eval", 4),
    ]
    assert log.sample_info is not None and log.sample_info["phase"] == "train"


def test_close_ends_a_window_left_open(tmp_path: Path) -> None:
    """close() with a window still open (a ``batch()`` entered and never
    exited): the window ends there, its batch counted, and its op callback
    is removed: nothing records for a closed listener."""
    from tensorflow.python.framework import op_callbacks

    model = _net()
    opt = keras.optimizers.SGD(0.01)
    (x, y), (x2, y2) = _batches(2)
    listener = _Listener(model, tmp_path / "log", strict=True, mode="exact")
    _step(listener, model, opt, x, y)
    assert not op_callbacks.should_invoke_op_callbacks()
    cm = listener.batch()
    cm.__enter__()
    with tf.GradientTape() as tape:
        loss = _LOSS(y2, model(x2, training=True))
    tape.gradient(loss, model.trainable_variables)
    assert op_callbacks.should_invoke_op_callbacks()
    listener.close()
    assert not op_callbacks.should_invoke_op_callbacks()
    cm.__exit__(None, None, None)  # the user's late exit: a no-op
    log = tracelog.load(tmp_path / "log")
    assert [e.usage.batches for e in log.entries_sorted()] == [2, 2]
