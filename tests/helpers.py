"""Recording helpers shared by the tests."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import tracelog
from tracelog.adapters.torch import TorchListener


def record(
    model: torch.nn.Module,
    log_dir: Path,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    epochs: int = 1,
    eval_batches: int = 1,
    strict: bool = True,
    lr: float = 0.05,
) -> tracelog.TraceLog:
    """Train for real with a listener attached, then run eval batches."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    listener = TorchListener(model, log_dir, strict=strict)
    for _epoch in listener.epochs(epochs):
        model.train()
        for x, y in batches:
            with listener.batch():
                loss = loss_fn(model(x), y)
                loss.backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        with torch.no_grad():
            for x, y in batches[:eval_batches]:
                with listener.batch():
                    loss_fn(model(x), y)
    return listener.close()


def load_whole(log_dir: Any) -> tracelog.TraceLog:
    """The log at `log_dir`, every batch recorded and no op Unsupported."""
    log = tracelog.load(log_dir)
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.Unsupported" not in ops, ops
    return log


def assert_translated(report: Any) -> None:
    """A check report on a log with a float64 reference: every float32 row has
    its translation twin "<name> [float64]", the float64 run ran (no "[float64]
    not run" row), and every row passed."""
    names = [c.name for c in report.comparisons]
    assert not any(n.startswith("[float64] not run") for n in names), report.table()
    twins = {n for n in names if n.endswith(" [float64]")}
    missing = [n for n in names if n not in twins and f"{n} [float64]" not in twins]
    assert twins and missing == [], report.table()
    assert report.ok, report.table()


def edit_onnx_graphs(monkeypatch: Any, edit: Callable[[tracelog.Graph], bool]) -> None:
    """The ONNX target's model built from edited graphs: every log the ONNX
    target loads has `edit` applied to each of its graphs (edit returns whether
    it changed one), as if model.onnx had that node changed."""
    from tracelog.emit import onnx_model

    class Edited(tracelog.TraceLog):
        @classmethod
        def load(cls, log_dir: Any, check_tensors: bool = True) -> tracelog.TraceLog:
            log = tracelog.TraceLog.load(log_dir, check_tensors)
            assert any([edit(g) for g in log.graphs.values()]), "nothing to edit"
            return log

    monkeypatch.setattr(onnx_model, "TraceLog", Edited)


def assert_lint_clean(text: str, what: str = "program") -> None:
    """An emitted program as a user's CI sees it with no configuration: black
    at its defaults changes nothing, and ruff's pyflakes (F) and isort (I)
    rules find nothing."""
    import black

    assert black.format_str(text, mode=black.Mode()) == text, f"{what}: not black-clean at 88"
    ruff = shutil.which("ruff", path=sysconfig.get_path("scripts")) or shutil.which("ruff")
    assert ruff, "ruff is a dev dependency (pip install -e '.[dev]')"
    done = subprocess.run(
        [ruff, "check", "--isolated", "--select", "F,I", "--stdin-filename", "program.py", "-"],
        input=text,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"{what}: ruff check --select F,I\n{done.stdout}{done.stderr}"


def own_gradients(log_dir: Any) -> float:
    """The largest relative difference between the sample's gradients and the
    float64 replay of its own batch: float32 rounding for a sample whose
    gradients are its own micro-batch's; about 1 for an average over ranks or
    a sum over micro-batches."""
    import numpy as np

    from tracelog.sample import grad_key, reference_key

    sample = tracelog.load(log_dir).sample()
    worst = 0.0
    for key in [k for k in sample if k.startswith(grad_key(""))]:
        got, ref = sample[key].astype(np.float64), sample[reference_key(key)]
        worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
    return worst


def validate_against_schema(doc: Any, schema_file: Path) -> None:
    """Assert that ``doc`` (a --format json output) follows the JSON schema in
    ``schema_file``, and that the schema itself is valid."""
    import json

    import pytest

    jsonschema = pytest.importorskip(
        "jsonschema", reason="the JSON is validated against its schema"
    )
    schema = json.loads(schema_file.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)


def record_keras_lambda(fn: Callable[[Any], Any], log_dir: Path, width: int) -> tracelog.TraceLog:
    """A Keras model with `fn` in a Lambda between two Dense layers (the first
    `width` wide), trained with a GradientTape on a batch of 6 and a short one
    of 4, recorded strictly; the closed log."""
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    layers = keras.layers
    model = keras.Sequential(
        [keras.Input((6,)), layers.Dense(width), layers.Lambda(fn), layers.Dense(5)]
    )
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((10, 6)).astype("float32"), rng.integers(0, 5, 10)
    listener = tracelog.Listener(model, log_dir, strict=True)
    for i in (0, 6):  # a batch of 6, then a short one of 4
        with listener.batch(), tf.GradientTape() as tape:
            value = loss(y[i : i + 6], model(x[i : i + 6], training=True))
        tape.gradient(value, model.trainable_variables)
    return listener.close()
