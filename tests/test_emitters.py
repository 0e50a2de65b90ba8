"""Every program emitter: its op table covers the vocabulary, and on every zoo
case the emitted program reproduces PyTorch's predictions, loss and
gradients, every node agreeing with onnx.reference, black-formatted."""

from __future__ import annotations

import pytest

import tracelog
from tracelog.emit import TARGETS, get_target
from tracelog.emit.common import format_source
from tracelog.ops import vocabulary
from tracelog.parity import node_comparisons

FRAMEWORK = {"tensorflow": "tensorflow", "torch": "torch", "jax": "jax"}


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest) -> str:
    pytest.importorskip(FRAMEWORK[request.param], reason=f"the {request.param} target needs it")
    return request.param


def test_every_vocabulary_op_has_a_rule_or_is_listed_not_yet(target: str) -> None:
    table = get_target(target).table
    missing = [
        s.qualified
        for s in vocabulary()
        if s.qualified not in table and table.reason(s.qualified) is None
    ]
    assert missing == []
    assert set(table.not_yet_keys()) == {"tracelog.Unsupported"}


def test_parity_with_gradients(recorded, target: str) -> None:
    _, log_dir, _ = recorded
    report = tracelog.check(log_dir, target)
    assert report.ok, report.table()
    names = {c.name for c in report.comparisons}
    assert "loss" in names and any(n.startswith("grad ") for n in names)


def test_every_node_agrees_with_onnx_reference(recorded, target: str) -> None:
    _, log_dir, _ = recorded
    log = tracelog.load(log_dir)
    rows = node_comparisons(log, get_target(target), log_dir, 1e-5, 1e-4)
    bad = [(kind, n.qualified_op, n.module, c) for kind, n, c in rows if not c.ok]
    assert rows and not bad


def test_program_is_black_formatted(recorded, target: str) -> None:
    _, log_dir, _ = recorded
    text = tracelog.emit(log_dir, target).read_text()
    assert format_source(text) == text
