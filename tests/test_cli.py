"""Issue 16 item 6: ``tracelog --version``, examples in every subcommand's
--help, and progress on stderr that never reaches stdout (nor JSON output),
off when stderr is not a terminal or with --quiet."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import record

import tracelog
from tracelog import progress
from tracelog.cli import build_parser, main

COMMANDS = ["show", "verify", "emit", "check", "diff", "compare"]


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "log"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    record(model, out, [(torch.randn(5, 4), torch.arange(5) % 3)], F.cross_entropy)
    return out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"tracelog {tracelog.__version__}"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_examples(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    examples = text.split("examples:\n", 1)[1]
    assert f"tracelog {command} " in examples and "--quiet" in text


def test_progress_off_when_not_a_tty(
    log_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    assert main(["show", str(log_dir), "--json"]) == 0  # pytest's stderr is no terminal
    out, err = capsys.readouterr()
    assert json.loads(out)["recorded"] == 2 and err == ""


def _slow_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    """A terminal on stderr and work that takes longer than the delay."""
    monkeypatch.setattr("tracelog.cli.stderr_is_tty", lambda: True)
    monkeypatch.setattr(progress, "DELAY_S", 0.05)
    monkeypatch.setattr(progress, "REFRESH_S", 0.01)
    load = tracelog.TraceLog.load.__func__  # type: ignore[attr-defined]

    def slow_load(cls: type, path: object, check_tensors: bool = True) -> tracelog.TraceLog:
        progress.stage("loading slowly")
        time.sleep(1.0)  # long beside DELAY_S, even on a loaded machine
        return load(cls, path, check_tensors)  # type: ignore[no-any-return]

    monkeypatch.setattr(tracelog.TraceLog, "load", classmethod(slow_load))


def test_progress_on_stderr_only(
    log_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_tty(monkeypatch)
    assert main(["show", str(log_dir), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["recorded"] == 2  # stdout is the JSON, nothing else
    assert "loading slowly" in err
    assert main(["diff", str(log_dir), str(log_dir), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["equal"] is True and "loading slowly" in err


def test_quiet(
    log_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_tty(monkeypatch)
    assert main(["show", str(log_dir), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(str(log_dir)) and err == ""


def test_emit_prints_only_the_path(
    log_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_tty(monkeypatch)
    assert main(["emit", str(log_dir), "--target", "torch"]) == 0
    out, err = capsys.readouterr()
    # the line names the stage that blocks (a draw of "emitting torch" before
    # the load began would depend on the thread's timing)
    assert out == f"{log_dir / 'program_torch.py'}\n" and "loading slowly" in err


def test_every_command_takes_quiet() -> None:
    for command in COMMANDS:
        args = [command, "a"] + (["b"] if command in ("diff", "compare") else [])
        args += ["--target", "torch"] if command in ("emit", "check") else []
        assert build_parser().parse_args([*args, "-q"]).quiet is True
