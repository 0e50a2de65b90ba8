"""The emitted ONNX model of keras.applications networks trained for two
batches with model.fit at 32x32, batch 2, is valid ONNX and runs:
onnx.checker (full_check, which runs shape and type inference through every
function) and an onnxruntime InferenceSession on the recorded batch.

Every case of tests/test_keras_layers.py gets the same through the ONNX
target's own check (``tracelog.check(..., "onnx")`` runs the full checker and
onnxruntime). ResNet50, DenseNet121 and ConvNeXtTiny are in
``python benchmarks/models_matrix.py --keras`` (minutes each). The deep
applications are checked for validity and execution here: their float32
parity at batch 2 (batch norm over two values at 1x1 spatial size) is left
to the float64 reference (docs/keras-adapter-notes.md)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tracelog

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
keras = pytest.importorskip("keras", reason="the Keras adapter needs keras 3")


def _valid_and_runs(log_dir) -> list[np.ndarray]:
    """Check the emitted model.onnx fully and run it on onnxruntime with the
    recorded batch's inputs (any dtype the model declares)."""
    path = tracelog.emit(log_dir, target="onnx")
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    from tracelog.sample import sample_feeds

    recorded = sample_feeds(tracelog.load(log_dir).sample())
    feeds = {i.name: recorded[i.name] for i in sess.get_inputs() if i.name in recorded}
    missing = [i.name for i in sess.get_inputs() if i.name not in feeds]
    assert not missing, f"no recorded value for inputs {missing}"
    outs = sess.run(None, feeds)
    assert all(np.isfinite(o).all() for o in outs if o.dtype.kind == "f")
    return outs


def _fit(name: str, log_dir) -> None:
    from tracelog.keras import TracelogCallback

    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(weights=None, input_shape=(32, 32, 3), classes=10)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.random((4, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, 4)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[TracelogCallback(log_dir)])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["EfficientNetB0", "MobileNetV2"])
def test_application_onnx_is_valid_and_runs(name: str, tmp_path) -> None:
    _fit(name, tmp_path)
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    outs = _valid_and_runs(tmp_path)
    assert outs[0].shape == (2, 10)
