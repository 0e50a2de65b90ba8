"""A program's head is formatted in pieces (program._head): the intro, each
prelude statement (once per process) and the parameter tables, joined with
the blank lines black sets, which is black's text of the whole head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from zoo import CNNBnDrop

import tracelog
from tracelog.emit import program
from tracelog.emit.common import format_source


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


def _log(tmp_path: Path, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Path:
    torch.manual_seed(0)
    with tracelog.Listener(model, tmp_path / "log") as listener, listener.batch():
        nn.functional.cross_entropy(model(x), y).backward()
    return tmp_path / "log"


@pytest.mark.parametrize("model", ["blocks", "cnn"])  # module kinds' tables; layout notes
@pytest.mark.parametrize("target", ["torch", "tensorflow", "jax"])
@pytest.mark.parametrize("standalone", [False, True])
def test_the_head_in_pieces_is_blacks_text_of_the_whole(
    tmp_path: Path, monkeypatch: Any, model: str, target: str, standalone: bool
) -> None:
    torch.manual_seed(0)
    if model == "blocks":
        net: nn.Module = nn.Sequential(*[_Block() for _ in range(3)], nn.Linear(8, 3))
        log_dir = _log(tmp_path, net, torch.randn(4, 8), torch.tensor([0, 1, 2, 0]))
    else:
        log_dir = _log(tmp_path, CNNBnDrop(), torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3]))
    heads: list[tuple[str, str]] = []
    pieces = program._head

    def checked(intro: str, prelude: list[str], tables: str, line_length: int) -> str:
        text = pieces(intro, prelude, tables, line_length)
        whole = program.head_source(intro, prelude, tables)
        heads.append((text, format_source(whole, line_length)))
        return text

    monkeypatch.setattr(program, "_head", checked)
    tracelog.emit(log_dir, target=target, standalone=standalone)
    assert len(heads) == 1
    assert heads[0][0] == heads[0][1]


@pytest.mark.parametrize(
    "prelude",
    [
        [],
        ["X = 1"],
        ["def f():\n    return 1", "Y = 2"],
        [
            "X = (1,)",
            "# a note\nclass K:\n    pass",
            "@property\ndef g(self): return 1",
            "Z = {'a': 1}",
        ],
    ],
)
def test_the_blank_lines_between_pieces_are_blacks(prelude: list[str]) -> None:
    intro = '"""Doc."""\n\nimport os\n\n# Recorded from a test.\n'
    tables = "def under(p):\n    return p\n\n\n# rows\nROWS = [\n    1,\n]\n"
    whole = program.head_source(intro, prelude, tables)
    assert program._head(intro, prelude, tables, 88) == format_source(whole)
