"""Every target: its op table covers the vocabulary, and on every zoo case the
emitted program (or model.onnx) reproduces PyTorch's predictions and loss,
and gradients where the target has autodiff; programs agree with
onnx.reference node by node and are black-formatted."""

from __future__ import annotations

import pytest
from helpers import assert_lint_clean, assert_translated

import tracelog
from tracelog.emit import PROGRAM_TARGETS, TARGETS, get_target, targets
from tracelog.emit.common import format_source
from tracelog.ops import vocabulary
from tracelog.parity import node_comparisons


def _needs(target: str) -> str:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    return target


@pytest.fixture(params=TARGETS)
def any_target(request: pytest.FixtureRequest) -> str:
    return _needs(request.param)


@pytest.fixture(params=PROGRAM_TARGETS)
def target(request: pytest.FixtureRequest) -> str:
    return _needs(request.param)


def _table(target: str):
    return targets.get(target).table


def test_every_vocabulary_op_has_a_rule_or_is_listed_not_yet(any_target: str) -> None:
    table = _table(any_target)
    missing = [
        s.qualified
        for s in vocabulary()
        if s.qualified not in table and table.reason(s.qualified) is None
    ]
    assert missing == []
    # whole ops not written: only what the adapters could not record, and in ONNX the
    # tracelog ops whose schema says why they have no function (none now); forms
    # of an op a target cannot write ("Slice/reversed") are listed apart
    no_function = {s.qualified for s in vocabulary() if s.no_function}
    allowed = {"tracelog.Unsupported"} | (no_function if any_target == "onnx" else set())
    assert {k for k in table.not_yet_keys() if "/" not in k} == allowed


def test_parity_with_gradients(recorded, any_target: str) -> None:
    _, log_dir, _ = recorded
    report = tracelog.check(log_dir, any_target)
    assert report.ok, report.table()
    names = {c.name for c in report.comparisons}
    assert "loss" in names and "prediction" in names
    if any_target != "onnx":  # ONNX has no autodiff
        assert any(n.startswith("grad ") for n in names)
    elif tracelog.load(log_dir).sample_info["reference"] == "float64":
        assert_translated(report)  # and model.onnx in float64 against the reference


def test_every_node_agrees_with_onnx_reference(recorded, target: str) -> None:
    _, log_dir, _ = recorded
    log = tracelog.load(log_dir)
    rows = node_comparisons(log, get_target(target), log_dir, 1e-5, 1e-4)
    bad = [(kind, n.qualified_op, n.module, c) for kind, n, c in rows if not c.ok]
    assert rows and not bad


def test_function_bodies_formatted_in_pieces_are_blacks_text(
    recorded, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long graph functions are formatted a few statements at a time (black's
    time per statement grows with the block): with pieces of 2 statements,
    every program is still byte for byte black's text for the whole, and the
    same text as unbroken formatting gives."""
    import tracelog.emit.program as program

    _, log_dir, _ = recorded
    whole = tracelog.emit(log_dir, target, out=str(log_dir / "whole.py")).read_text()
    program._formatted.cache_clear()
    monkeypatch.setattr(program, "CHUNK_STATEMENTS", 2)
    calls: list[int] = []
    real_cuts = program._chunk_cuts

    def cuts(text: str, lines: list[str], chunk: int) -> list[int]:
        found = real_cuts(text, lines, 2)
        calls.append(len(found))
        return found

    monkeypatch.setattr(program, "_chunk_cuts", cuts)
    pieces = tracelog.emit(log_dir, target, out=str(log_dir / "pieces.py")).read_text()
    program._formatted.cache_clear()
    assert any(calls), "no function was long enough to be cut"
    assert pieces == whole
    assert format_source(pieces) == pieces


def test_program_is_black_and_ruff_clean(recorded, target: str) -> None:
    """black at its defaults (88) and ruff's F and I rules, with no config;
    at another line length on request, black-clean at that length."""
    _, log_dir, _ = recorded
    text = tracelog.emit(log_dir, target).read_text()
    assert_lint_clean(text, target)
    wide = tracelog.emit(log_dir, target, out=str(log_dir / "wide.py"), line_length=120)
    assert format_source(wide.read_text(), 120) == wide.read_text() != text


@pytest.mark.parametrize(
    ("before", "after", "index"),
    [
        (("batch", 144), ("batch", 1, 1, 144), ":, None, None, :"),
        (("batch", 8), ("batch", 8, 1, 1), ":, :, None, None"),
        (("batch", 1), ("batch", 1, 1), ":, :, None"),
        ((), (1, 1), "None, None"),
        (("batch", 8), ("batch", 8), None),  # no dim inserted
        (("batch", 8), ("batch", 2, 4), None),  # a split
        ((3, 3, 8, 1), (3, 3, 1, 8), None),  # a move
    ],
)
def test_a_reshape_that_only_inserts_unit_dims_is_an_index(
    before: tuple, after: tuple, index: str | None
) -> None:
    """Such a reshape is written x[:, None, None, :] in every target: no
    width in its text, so squeeze-excite blocks of every width share one."""
    from tracelog.emit.rules import unit_dims_index

    assert unit_dims_index(before, after) == index
