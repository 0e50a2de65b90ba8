"""The TensorFlow emitter: the op table, parity on every zoo case (with
gradients), per-node agreement with onnx.reference, and the program text."""

from __future__ import annotations

import pytest

import tracelog
from tracelog.emit import get_target
from tracelog.emit.common import format_source
from tracelog.emit.tensorflow import TF
from tracelog.ops import vocabulary
from tracelog.parity import node_comparisons

tf = pytest.importorskip("tensorflow", reason="the TensorFlow target needs tensorflow-cpu")


def test_every_vocabulary_op_has_a_rule_or_is_listed_not_yet() -> None:
    missing = [
        s.qualified
        for s in vocabulary()
        if s.qualified not in TF and TF.reason(s.qualified) is None
    ]
    assert missing == []


def test_parity_with_gradients(recorded) -> None:
    case, log_dir, _ = recorded
    report = tracelog.check(log_dir, "tensorflow")
    assert report.ok, report.table()
    names = {c.name for c in report.comparisons}
    assert "loss" in names and any(n.startswith("grad ") for n in names)


def test_every_node_agrees_with_onnx_reference(recorded) -> None:
    case, log_dir, _ = recorded
    log = tracelog.load(log_dir)
    rows = node_comparisons(log, get_target("tensorflow"), log_dir, 1e-5, 1e-4)
    bad = [(kind, n.qualified_op, n.module, c) for kind, n, c in rows if not c.ok]
    assert rows and not bad


def test_program_is_black_formatted(recorded) -> None:
    _, log_dir, _ = recorded
    text = tracelog.emit(log_dir, "tensorflow").read_text()
    assert format_source(text) == text
