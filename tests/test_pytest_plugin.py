"""The pytest plugin (``tracelog_golden``) and ``tracelog.testing``, driven
through pytester: a missing golden fails with the update hint,
``--tracelog-update`` writes, the next run passes, a model change fails with
both diffs, and under ``CI`` nothing is ever written."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import torch.nn as nn
import torch.nn.functional as F
from helpers import record

import tracelog
import tracelog.parity
from tracelog.testing import assert_parity, assert_same_graphs

pytest_plugins = ["pytester"]
ROOT = Path(__file__).parent.parent

TEST_FILE = """
import torch
import torch.nn as nn
import torch.nn.functional as F
from tracelog.adapters.torch import TorchListener

HIDDEN = {hidden}


def _record(path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    listener = TorchListener(model, path)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    for _ in listener.epochs(1):
        with listener.batch():
            F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    listener.close()


def test_mlp(tmp_path, tracelog_golden):
    _record(tmp_path / "log")
    tracelog_golden(tmp_path / "log", target="torch")
"""
PROGRAM = Path("__tracelog__/test_mlp_model.test_mlp.torch.golden")
GRAPHS = Path("__tracelog__/test_mlp_model.test_mlp.graphs.golden")


def _entry_point_installed() -> bool:
    eps = importlib.metadata.entry_points(group="pytest11")
    return any(ep.value == "tracelog.pytest_plugin" for ep in eps)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """pytest in process, the plugin loaded as an installed tracelog loads it
    (the entry point), or by -p where this checkout is not the installed one."""
    plugin = [] if _entry_point_installed() else ["-p", "tracelog.pytest_plugin"]
    return pytester.runpytest(*plugin, "-p", "no:cacheprovider", *args)


@pytest.fixture(scope="module")
def mlp_logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import torch

    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    out = []
    for act in (nn.ReLU, nn.Tanh):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), act(), nn.Linear(8, 3))
        log_dir = tmp_path_factory.mktemp(act.__name__)
        record(model, log_dir, [(x, y)], F.cross_entropy)
        out.append(log_dir)
    return out[0], out[1]


@pytest.fixture(scope="module", autouse=True)
def _warm(mlp_logs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Record and emit once out here first: pytester's in-process runs drop the
    modules a run imported, and torch cannot import its lazily loaded parts
    (torch._dynamo) twice in one process."""
    tracelog.emit(mlp_logs[0], "torch", str(tmp_path_factory.mktemp("warm") / "p.py"))


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_mlp_model=TEST_FILE.format(hidden=8))
    return pytester


def test_missing_golden_fails_with_the_update_hint(project: pytest.Pytester) -> None:
    result = _run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [f"*tracelog: no golden file *{PROGRAM.name}", "*run `pytest --tracelog-update`*"]
    )
    assert not (project.path / "__tracelog__").exists()


def test_update_writes_and_the_next_run_passes(project: pytest.Pytester) -> None:
    result = _run(project, "--tracelog-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["tracelog: wrote 2 golden file(s):"])
    program = (project.path / PROGRAM).read_text()
    assert "def " in program and "import torch" in program
    assert tracelog.diff.load_snapshot((project.path / GRAPHS).read_text()).graphs
    assert sorted(p.name for p in (project.path / "__tracelog__").iterdir()) == sorted(
        [PROGRAM.name, GRAPHS.name]
    )
    _run(project).assert_outcomes(passed=1)
    assert (project.path / PROGRAM).read_text() == program


def test_a_model_change_fails_with_both_diffs(project: pytest.Pytester) -> None:
    _run(project, "--tracelog-update").assert_outcomes(passed=1)
    project.makepyfile(test_mlp_model=TEST_FILE.format(hidden=16))
    result = _run(project)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "semantic diff (golden -> now):" in out
    assert f"{GRAPHS.name} (golden) -> now: 5 differences" in out
    assert "~ 0 (Linear)" in out and "0.weight  float32[8, 4] -> float32[16, 4]" in out
    assert "program diff (golden -> now):" in out
    assert f"--- {PROGRAM.name} (golden)" in out and "+++ emitted now" in out
    result.stdout.fnmatch_lines(["*if the change is intended, run `pytest --tracelog-update`*"])


def test_ci_never_writes(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    result = _run(project, "--tracelog-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*CI is set, so --tracelog-update writes no golden file here; run `pytest "
            "--tracelog-update` locally and commit __tracelog__/"
        ]
    )
    assert not (project.path / "__tracelog__").exists()
    monkeypatch.delenv("CI")
    _run(project, "--tracelog-update").assert_outcomes(passed=1)
    golden = (project.path / PROGRAM).read_bytes()
    project.makepyfile(test_mlp_model=TEST_FILE.format(hidden=16))
    monkeypatch.setenv("CI", "1")
    _run(project, "--tracelog-update").assert_outcomes(failed=1)
    assert (project.path / PROGRAM).read_bytes() == golden


@pytest.mark.parametrize(
    "value, ci",
    [("true", True), ("1", True), ("yes", True), ("", False), ("0", False), ("false", False)],
)
def test_what_counts_as_ci(monkeypatch: pytest.MonkeyPatch, value: str, ci: bool) -> None:
    from tracelog.pytest_plugin import in_ci

    monkeypatch.setenv("CI", value)
    assert in_ci() is ci
    monkeypatch.delenv("CI")
    assert not in_ci()


def test_plugin_is_inert(pytester: pytest.Pytester) -> None:
    """Loading it imports no framework; a suite that never asks for the
    fixture runs as before and gets no files."""
    code = (
        "import sys, tracelog.pytest_plugin\n"
        "heavy = {'torch', 'tensorflow', 'keras', 'jax', 'onnx', 'tracelog.emit.program'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"
    pytester.makepyfile(test_plain="def test_one():\n    assert 1 + 1 == 2\n")
    _run(pytester, "--tracelog-update").assert_outcomes(passed=1)
    assert sorted(p.name for p in pytester.path.iterdir()) == ["test_plain.py"]
    _run(pytester, "--help").stdout.fnmatch_lines(["*--tracelog-update*"])


def test_pyproject_declares_the_entry_point() -> None:
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["pytest11"] == {"tracelog": "tracelog.pytest_plugin"}


def test_assert_same_graphs(mlp_logs: tuple[Path, Path]) -> None:
    relu, tanh = mlp_logs
    assert_same_graphs(relu, relu)
    with pytest.raises(AssertionError, match=r"(?s)graphs differ.*op Relu -> Tanh"):
        assert_same_graphs(relu, tanh)


def test_assert_parity(mlp_logs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    assert_parity(mlp_logs[0], "torch")

    class Failing:
        ok = False

        def table(self) -> str:
            return "prediction  1.0  NO"

    monkeypatch.setattr(tracelog.parity, "check", lambda *a, **k: Failing())
    with pytest.raises(AssertionError, match=r"(?s)does not match.*prediction  1.0  NO"):
        assert_parity(mlp_logs[0], "torch")
