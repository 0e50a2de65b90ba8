"""examples/keras_digits_to_torch.py as a new user runs it: a Keras CNN trained
with model.fit (traced steps) on the digits, recorded, emitted to PyTorch with
parity; and the same log round-tripped to JAX and ONNX."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

import tracelog

pytest.importorskip("tensorflow", reason="the Keras example needs tensorflow-cpu")

EXAMPLE = Path(__file__).parent.parent / "examples" / "keras_digits_to_torch.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("keras_digits_to_torch", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("keras_digits")
    assert module.main(["--out", str(out), "--epochs", "2"]) == 0
    return module, out


def test_fit_batches_counted_per_traced_step(run) -> None:
    module, out = run
    x, _ = module.digits()
    n_val = int(len(x) * 0.2)  # Keras' validation_split takes the last 20%
    train_batches = math.ceil((len(x) - n_val) / 64)
    eval_batches = math.ceil(n_val / 64)
    log = tracelog.load(out)
    assert log.framework["mode"] == "graph" and log.unrecorded == 0
    rows = [(e.kind, e.phase, e.usage.batches, e.usage.epochs) for e in log.entries_sorted()]
    assert rows == [
        ("prediction", "train", 2 * train_batches, [0, 1]),
        ("loss", "train", 2 * train_batches, [0, 1]),
        ("prediction", "eval", 2 * eval_batches, [0, 1]),
        ("loss", "eval", 2 * eval_batches, [0, 1]),
    ]


def test_torch_program_runs_nchw_inside(run) -> None:
    _, out = run
    text = (out / "program_torch.py").read_text()
    assert (
        "predict_train: 2 transposes kept: data input x enters NHWC; back to NHWC for Reshape"
        in text
    )
    # the model's part: module kinds' functions (shared by the train and eval
    # graphs) and the graph functions, before the sample keys
    body = text.split("\ndef input_key", 1)[0]
    data_permutes = [
        line
        for line in body.splitlines()
        if ".permute([0, 3, 1, 2])" in line or ".permute([0, 2, 3, 1])" in line
    ]
    assert len(data_permutes) == 2  # where the data enters, and before the flatten


@pytest.mark.parametrize("target", ["torch", "jax", "onnx"])
def test_round_trips(run, target: str) -> None:
    _, out = run
    report = tracelog.check(out, target=target)
    assert report.ok, report.table()
    names = [c.name for c in report.comparisons]
    if target == "jax":  # jitted, against TensorFlow's float64 reference
        assert "loss" in names and "loss [float64]" in names
