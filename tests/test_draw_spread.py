"""benchmarks/draw_spread.py's control: a program's error per output group
over another target's program's (the source's own kernels), draw by draw."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "draw_spread.py"


def _draw_spread() -> Any:
    spec = importlib.util.spec_from_file_location("draw_spread", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("grad block6c_dwconv/kernel", "grad dwconv/kernel"),
        ("grad block4b_se_reduce/bias", "grad reduce/bias"),
        ("update:conv5_block12_1_bn/moving_mean", "update bn/moving_mean"),
        ("grad layer1.0.conv1.weight", "grad conv/weight"),
        ("grad 0.bias", "grad /bias"),
        ("prediction", "prediction"),
        ("loss", "loss"),
    ],
)
def test_group_is_kind_layer_type_and_parameter(name: str, expected: str) -> None:
    assert _draw_spread().group(name) == expected


def test_control_prints_geometric_mean_of_error_ratios_per_group(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spread = _draw_spread()
    # two batch-norm gammas whose errors are 2x and 0.5x the control's on draw 0
    # (geometric mean 1), both 3x on draw 1; a zero error is left out
    errs = {
        "grad a_bn/gamma": [2.0, 3.0],
        "grad b_bn/gamma": [0.5, 3.0],
        "loss": [0.0, 1.0],
    }
    control_errs = {
        "grad a_bn/gamma": [1.0, 1.0],
        "grad b_bn/gamma": [1.0, 1.0],
        "loss": [1.0, 4.0],
    }
    control_ratios = {name: [1.0, 1.5] for name in control_errs}
    spread.print_control({}, errs, "tensorflow", (control_ratios, control_errs), 1)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "largest ratio of the tensorflow program: 1.00  1.50"
    assert lines[3].split() == ["group", "n", "draw", "0", "draw", "1"]
    # each row: the group (kind, layer type/parameter), its count, one mean per draw
    rows = {" ".join(line.split()[:-3]): line.split()[-3:] for line in lines[4:]}
    assert set(rows) == {"grad bn/gamma", "loss"}
    n, first, second = rows["grad bn/gamma"]
    assert n == "2" and math.isclose(float(first), 1.0) and math.isclose(float(second), 3.0)
    assert rows["loss"][1:] == ["nan", "0.25"]
