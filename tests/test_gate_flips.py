"""benchmarks/gate_flips.py: the gates float32 rounding flipped in a
program's forward, found element by element against its float64 run."""

from __future__ import annotations

import importlib.util
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import tracelog
from tracelog.emit.harness import attach

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "gate_flips.py"


def _gate_flips() -> Any:
    spec = importlib.util.spec_from_file_location("gate_flips", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass reads its own module
    spec.loader.exec_module(module)
    return module


class OneThird(nn.Module):
    """relu(x * w - 1) and relu(x * w - 2) with w the float32 nearest 1/3 and
    x = 3: the first's input is 2.98e-8 in float64 and exactly 0 in float32
    (3w rounds to 1; a multiply then a subtract, no fused multiply-add), a
    gate rounding closed; the second's is -1 either way."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1 / 3], dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.w
        return torch.relu(h - 1) + torch.relu(h - 2)


@pytest.fixture(scope="module")
def one_third_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = OneThird()
    log_dir = tmp_path_factory.mktemp("gates") / "log"
    with tracelog.Listener(model, log_dir, strict=True) as listener:
        for _ in range(2):
            with listener.batch():
                model(torch.full((4, 1), 3.0)).square().mean().backward()
    return log_dir


def test_the_gate_rounding_closed_is_found_and_named(one_third_log: Path) -> None:
    gate_flips = _gate_flips()
    program = Path(tracelog.emit(one_third_log, target="torch"))
    ns = runpy.run_path(str(program), run_name="gate_flips_test")
    attach(ns, "torch")
    narrow, wide = gate_flips.forward_gates(ns, one_third_log, "torch", 0)
    assert [g.where.split(": ", 1)[1] for g in narrow] == [
        "relu = torch.relu(sub)",
        "relu_1 = torch.relu(sub_1)",
    ]
    flips = [
        int(((a.sides[0] > 0) != (b.sides[0] > 0)).sum()) for a, b in zip(narrow, wide, strict=True)
    ]
    assert flips == [4, 0]  # every row's first gate; the second is far from its kink
    first64 = wide[0].sides[0]
    assert np.all(first64 > 0) and np.all(first64 < 1e-7)
    assert np.all(narrow[0].sides[0] == 0)
    assert narrow[0].where.startswith("predict_train line ")


def test_the_script_prints_the_flips_beside_the_ratios(one_third_log: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(BENCHMARK), str(one_third_log), "--draws", "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = out.splitlines()
    assert lines[0] == "draw 0: largest float32 ratios"
    flipped = [line for line in lines if "flipped (" in line]
    assert len(flipped) == 1 and flipped[0].strip().startswith("4 flipped (float64 3.0e-08")
    assert "torch.relu(" in flipped[0]
    assert lines[-2].strip() == "4 flipped gate elements over 2 gate calls"
