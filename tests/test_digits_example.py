"""The README's main job, as a new user runs it: 3 epochs on the digits with
an MLP and a CNN, one train graph pair per model counted for every batch."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from helpers import assert_translated

import tracelog
from tracelog.verify import verify

EXAMPLE = Path(__file__).parent.parent / "examples" / "digits_torch.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("digits_torch", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("digits")
    assert module.main(["--out", str(out)]) == 0
    return module, out


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_digits_graphs_and_counts(run, name: str) -> None:
    module, out = run
    x_tr, _, x_te, _ = module.digits()
    train_batches = math.ceil(len(x_tr) / 64)  # 23: 22 full batches and one of 29
    eval_batches = math.ceil(len(x_te) / 64)  # 6: 5 full batches and one of 40
    assert len(x_tr) % 64 and len(x_te) % 64, "the data must end in short batches"
    log = tracelog.load(out / name)
    assert log.unrecorded == 0
    rows = [(e.kind, e.phase, e.usage.batches, e.usage.epochs) for e in log.entries_sorted()]
    assert rows == [
        ("prediction", "train", 3 * train_batches, [0, 1, 2]),
        ("loss", "train", 3 * train_batches, [0, 1, 2]),
        ("prediction", "eval", 3 * eval_batches, [0, 1, 2]),
        ("loss", "eval", 3 * eval_batches, [0, 1, 2]),
    ]
    for runtime in ("reference", "onnxruntime"):
        report = verify(out / name, runtime=runtime)
        assert report.ok, report.table()


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_digits_onnx_check_includes_the_translation(run, name: str) -> None:
    """model.onnx in float64 against torch's float64 replay of the sample batch
    (the CNN's batch norm statistics included), beside onnxruntime's float32."""
    _, out = run
    report = tracelog.check(out / name, "onnx")
    assert_translated(report)
    translated = [c for c in report.comparisons if c.name.endswith("[float64]")]
    assert max(c.max_rel for c in translated) < 1e-12, report.table()
