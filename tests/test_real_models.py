"""The models matrix in the suite: each real model of tests/real_models.py
(Hugging Face models from small configs, torch.nn recurrent, attention and
vision models) trains two batches under a listener; the log must hold no
unsupported op, and every target of the PyTorch side (TensorFlow, JAX, ONNX)
must pass its parity check on predictions, loss and gradients.
``python benchmarks/models_matrix.py`` prints the same as a table."""

from __future__ import annotations

from pathlib import Path

import pytest
import real_models

import tracelog

TARGETS = ["tensorflow", "jax", "onnx"]
FRAMEWORK = {"tensorflow": "tensorflow", "jax": "jax", "onnx": "onnxruntime"}


@pytest.fixture(scope="module", params=[c.name for c in real_models.CASES])
def model_log(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[real_models.ModelCase, Path]:
    case = real_models.BY_NAME[request.param]
    if case.needs:
        pytest.importorskip(case.needs, reason=f"{case.name} is built with {case.needs}")
    log_dir = tmp_path_factory.mktemp(case.name) / "run"
    real_models.train(case, log_dir, strict=True)
    return case, log_dir


def test_recorded_whole(model_log: tuple[real_models.ModelCase, Path]) -> None:
    case, log_dir = model_log
    log = tracelog.load(log_dir)
    assert not log.failures
    unsupported = [
        (n.attrs.get("source"), n.attrs.get("reason"), n.module)
        for e in log.entries_sorted()
        for n in log.graph(e.hash).nodes
        if n.op == "Unsupported"
    ]
    assert unsupported == []
    train = [p for p in log.pairs.values() if p.phase == "train"]
    assert sum(p.usage.batches for p in train) == 2
    if case.varies:  # batches of two lengths, one graph: the length is a symbol
        assert len(train) == 1, [log.graph(p.prediction).inputs for p in train]
    assert all(p.loss is not None for p in train)
    # the data are the graph's inputs: as constants, every program would give
    # back the recorded batch, and the parity check could not tell
    assert all(log.graph(p.prediction).inputs for p in train)
    assert log.sample_info is not None
    # a float64 reference that replays the batch: the parity check's translation rows
    assert log.sample_info.get("reference") == "float64", log.sample_info.get("reference")


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_parity(model_log: tuple[real_models.ModelCase, Path], target: str) -> None:
    pytest.importorskip(FRAMEWORK[target], reason=f"the {target} target needs its framework")
    report = tracelog.check(model_log[1], target)
    assert report.ok, report
