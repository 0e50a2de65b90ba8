"""Plain asserts for tests of models recorded with tracelog.

    from tracelog.testing import assert_parity, assert_same_graphs

    assert_same_graphs("runs/main", "runs/branch")   # AssertionError: the semantic diff
    assert_parity("runs/branch", "tensorflow")       # AssertionError: the parity table

For golden programs kept beside a test, see the ``tracelog_golden`` fixture
(:mod:`tracelog.pytest_plugin`).
"""

from __future__ import annotations

import os

from tracelog.log import TraceLog

__all__ = ["assert_parity", "assert_same_graphs"]


def assert_same_graphs(
    a: TraceLog | str | os.PathLike[str],
    b: TraceLog | str | os.PathLike[str],
    *,
    counts: bool = False,
) -> None:
    """Raise AssertionError, with the semantic diff as its message, unless the
    two logs hold the same graphs (and, with ``counts``, the same usage counts)."""
    from tracelog.diff import diff

    result = diff(a, b, counts=counts)
    if not result.equal:
        raise AssertionError("the logs' graphs differ:\n" + result.to_text())


def assert_parity(
    log_dir: str | os.PathLike[str], target: str = "tensorflow", **tolerances: float
) -> None:
    """Emit ``target``'s program for the log, run it on the recorded batch and
    raise AssertionError, with the parity table as its message, on a mismatch
    (``tracelog check``; tolerances as there: atol, rtol, grad_atol)."""
    from tracelog.parity import check

    report = check(log_dir, target, draw=0, **tolerances)
    if not report.ok:
        raise AssertionError(
            f"{target} program does not match the recorded batch:\n{report.table()}"
        )
