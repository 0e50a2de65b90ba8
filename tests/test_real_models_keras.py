"""The Keras side of the models matrix in the suite: the small real models of
tests/real_models_keras.py (recurrent text models with masking, an attention
encoder, a transposed-convolution autoencoder, a CNN trained by a custom
``@tf.function`` loop and by ``fit`` under MirroredStrategy) train two
batches under tracelog; nothing may be unsupported or unrecorded, and the
emitted PyTorch, JAX and ONNX programs must pass their parity checks on
predictions, loss and gradients. The keras.applications networks are in
``python benchmarks/models_matrix.py --keras`` (minutes each at 32x32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tracelog

pytest.importorskip("tensorflow", reason="the Keras side needs tensorflow-cpu")
real_models_keras = pytest.importorskip("real_models_keras")

SMALL = [c.name for c in real_models_keras.CASES if c.in_suite]
TARGETS = ["torch", "jax", "onnx"]


@pytest.fixture(scope="module", params=SMALL)
def keras_log(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    case = real_models_keras.BY_NAME[request.param]
    log_dir = tmp_path_factory.mktemp(case.name) / "run"
    log = real_models_keras.train(case, log_dir)
    return case, log_dir, log


def test_recorded_whole(keras_log: Any) -> None:
    case, log_dir, log = keras_log
    assert not log.failures, log.failures
    unsupported = [
        (n.attrs.get("source"), n.module)
        for e in log.entries_sorted()
        for n in log.graph(e.hash).nodes
        if n.op == "Unsupported"
    ]
    assert unsupported == []
    train = [p for p in log.pairs.values() if p.phase == "train"]
    assert sum(p.usage.batches for p in train) == 2  # two steps, whatever the replicas
    assert all(p.loss is not None for p in train)
    # the data are the graph's inputs: as constants, every program would give
    # back the recorded batch, and the parity check could not tell
    assert all(log.graph(p.prediction).inputs for p in train)
    assert log.sample_info is not None
    # a float64 reference that replays the batch: the parity check's translation rows
    assert log.sample_info.get("reference") == "float64", log.sample_info.get("reference")


@pytest.mark.parametrize("target", TARGETS)
def test_parity(keras_log: Any, target: str) -> None:
    case, log_dir, _ = keras_log
    report = tracelog.check(Path(log_dir), target=target)
    assert report.ok, report.table()
    if target != "onnx":
        assert any(c.name.startswith("grad ") for c in report.comparisons)
