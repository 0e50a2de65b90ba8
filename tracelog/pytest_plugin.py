"""pytest plugin: golden programs kept beside the tests (``tracelog_golden``).

Registered through the ``pytest11`` entry point when tracelog is installed
(``-p no:tracelog`` turns it off). It is inert until a test asks for the
fixture: at pytest startup it adds one option and imports only the standard
library and pytest (no framework; tracelog's own modules load on first use).

    def test_model_translates(tmp_path, tracelog_golden):
        record_my_model(tmp_path / "log")
        tracelog_golden(tmp_path / "log", target="tensorflow")

The first call emits the program and compares it byte for byte with
``__tracelog__/<test file>.<test>.<target>.golden`` beside the test file; the
log's graphs (no tensors) are kept as ``__tracelog__/<test file>.<test>.graphs.golden``
(JSON, see ``tracelog.diff.snapshot``). pytest collects neither. On a
difference the test fails with the semantic diff of the graphs and a unified
diff of the programs. ``pytest --tracelog-update`` writes new and changed
golden files; with the ``CI`` environment variable set (to anything but
``""``, ``0``, ``false`` or ``no``) nothing is ever written and the test fails
with a line saying how to update locally.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tracelog.diff import LogDiff

GOLDEN_DIR = "__tracelog__"
UPDATE = "--tracelog-update"
_WRITTEN = pytest.StashKey[list[Path]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tracelog", "tracelog golden programs")
    group.addoption(
        UPDATE,
        action="store_true",
        default=False,
        help="write new and changed tracelog golden files (__tracelog__/*.golden); "
        "never when the CI environment variable is set",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_WRITTEN] = []


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    written = config.stash.get(_WRITTEN, [])
    if written:
        terminalreporter.write_line(f"tracelog: wrote {len(written)} golden file(s):")
        for path in written:
            terminalreporter.write_line(f"  {path}")


def in_ci() -> bool:
    """Is the CI environment variable set (GitHub Actions, GitLab, ... set CI=true)?"""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _safe(name: str) -> str:
    """A test's name as part of a file name: [test_x[a/b]] -> test_x_a_b_."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip(".") or "_"


class Golden:
    """The ``tracelog_golden`` fixture's value: call it with a log directory."""

    def __init__(self, request: pytest.FixtureRequest, update: bool, ci: bool) -> None:
        self.request = request
        self.update = update and not ci
        self.refused = update and ci
        self.ci = ci
        node = request.node
        self.dir = Path(node.path).parent / GOLDEN_DIR
        self.stem = f"{_safe(Path(node.path).stem)}.{_safe(node.name)}"
        self.snapshots: dict[str, str] = {}  # stem -> the snapshot this test compared

    def __call__(
        self, log_dir: str | os.PathLike[str], target: str = "tensorflow", *, name: str = ""
    ) -> Path:
        """Emit ``target``'s program for the log and compare it, and the log's
        graphs, with the golden files; return the program's golden path."""
        from tracelog.diff import snapshot
        from tracelog.emit import targets

        stem = self.stem + (f".{_safe(name)}" if name else "")
        program_file = self.dir / f"{stem}.{_safe(target)}.golden"
        graphs_file = self.dir / f"{stem}.graphs.golden"
        graphs = snapshot(log_dir)
        if self.snapshots.setdefault(stem, graphs) != graphs:
            pytest.fail(
                "tracelog_golden: this test compares two different logs under one name; "
                "give each its own: tracelog_golden(log_dir, target, name=...)",
                pytrace=False,
            )
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / targets.file_name(target)
            program = targets.get(target).emit(log_dir, str(out)).read_bytes()
        old_program = _read(program_file)
        old_graphs = _read(graphs_file)
        semantic = self._semantic(old_graphs, graphs, graphs_file)
        if old_program == program and semantic is not None and semantic.equal:
            if old_graphs != graphs.encode() and self.update:  # counts only: keep them current
                self._write(graphs_file, graphs.encode())
            return program_file
        if self.update:
            self._write(program_file, program)
            self._write(graphs_file, graphs.encode())
            return program_file
        pytest.fail(
            self._message(program_file, old_program, program, semantic, graphs_file),
            pytrace=False,
        )

    def _semantic(self, old: bytes | None, new: str, where: Path) -> LogDiff | None:
        from tracelog.diff import diff, load_snapshot

        if old is None:
            return None
        result = diff(load_snapshot(old.decode("utf-8", "replace"), str(where)), load_snapshot(new))
        result.old, result.new = f"{where.name} (golden)", "now"
        return result

    def _write(self, path: Path, data: bytes) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        self.request.config.stash[_WRITTEN].append(path)

    def _hint(self, missing: bool = False) -> str:
        if self.refused:
            return (
                f"tracelog: CI is set, so {UPDATE} writes no golden file here; "
                f"run `pytest {UPDATE}` locally and commit {GOLDEN_DIR}/"
            )
        if self.ci:
            return f"tracelog: run `pytest {UPDATE}` locally and commit {GOLDEN_DIR}/"
        return (
            f"tracelog: if the change is intended, run `pytest {UPDATE}` and commit {GOLDEN_DIR}/"
        )

    def _message(
        self,
        program_file: Path,
        old: bytes | None,
        new: bytes,
        semantic: LogDiff | None,
        graphs_file: Path,
    ) -> str:
        if old is None or semantic is None:
            missing = program_file if old is None else graphs_file
            return f"tracelog: no golden file {missing}\n{self._hint(missing=True)}"
        parts = [f"tracelog: the emitted program or graphs differ from {program_file}"]
        if not semantic.equal:
            parts += ["", "semantic diff (golden -> now):", semantic.to_text()]
        if old != new:
            parts += ["", "program diff (golden -> now):", _program_diff(old, new, program_file)]
        return "\n".join([*parts, "", self._hint()])


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _program_diff(old: bytes, new: bytes, path: Path) -> str:
    from tracelog.diff import unified

    try:
        a, b = old.decode("utf-8"), new.decode("utf-8")
    except UnicodeDecodeError:  # a model file (onnx): no text to diff
        return f"binary: {len(old)} bytes -> {len(new)} bytes"
    return unified(a, b, f"{path.name} (golden)", "emitted now")


@pytest.fixture
def tracelog_golden(request: pytest.FixtureRequest) -> Iterator[Callable[..., Path]]:
    """``tracelog_golden(log_dir, target="tensorflow", name="")``: emit the
    program and compare it with the golden file beside the test (see the
    module's docstring)."""
    yield Golden(request, bool(request.config.getoption("tracelog_update")), in_ci())
