"""The float32 check judged on the branches the float32 run took: a real
program of each target records its gate decisions (ReLU, clamp, leaky ReLU,
max, min) in its float32 run, and its float64 run replays them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tracelog
from tracelog.parity import _import_path

# x, w, v, u, c: x*w + v*u - c is -1.1e-8 in float32 (two products, a sum and a
# difference, each rounded) and +1.95e-10 in float64 (found by search)
VALUES = [-1.2776802, 0.6304115, 0.5811658, 1.2945588]
C = -0.053111006


class Gates(nn.Module):
    """One gate of each kind the targets' tables name; the ReLU's input is
    the value above, on the other side of 0 in float32 than in float64, for
    every row of the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Parameter(torch.tensor([C]))
        self.s = nn.Parameter(torch.tensor([1e9, 0.5, 2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x[:, 0:1] * x[:, 1:2] + x[:, 2:3] * x[:, 3:4] - self.c
        parts = [
            torch.relu(h) * self.s[0],
            torch.clamp(x[:, 0:2] * self.s[1], -0.5, 0.5),
            F.leaky_relu(x[:, 0:2] * self.s[2], 0.1),
            torch.maximum(x[:, 1:2] * self.s[1], x[:, 2:3]),
            torch.minimum(x[:, 1:2], x[:, 3:4] * self.s[2]),
        ]
        return torch.cat(parts, dim=1)


@pytest.fixture(scope="module")
def gates_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = Gates()
    log_dir = tmp_path_factory.mktemp("gate_matched") / "log"
    x = torch.tensor([VALUES] * 4, dtype=torch.float32)
    h = x[:, 0:1] * x[:, 1:2] + x[:, 2:3] * x[:, 3:4] - model.c
    assert torch.all(h < 0)  # the float32 gate closed
    with tracelog.Listener(model, log_dir, strict=True) as listener:
        for _ in range(2):
            with listener.batch():
                model(x).square().mean().backward()
    return log_dir


def _program(log_dir: Path, target: str) -> dict[str, Any]:
    if target == "jax":
        pytest.importorskip("jax", reason="the JAX target needs jax")
    elif target == "tensorflow":
        pytest.importorskip("tensorflow", reason="the TensorFlow target needs tensorflow")
    # the program's own globals (runpy would hand back a copy, which the views
    # of the check's runs would not reach)
    return vars(_import_path(Path(tracelog.emit(log_dir, target=target)), target))


@pytest.mark.parametrize("target", ["torch", "tensorflow", "jax"])
def test_the_float32_rows_take_the_float32_runs_gates(gates_log: Path, target: str) -> None:
    report = tracelog.check(gates_log, target)
    assert report.ok, report
    names = [c.name for c in report.comparisons]
    note = [n for n in names if n.startswith("[float32] judged against")]
    # the ReLU's 4 rows flipped; every gate of the program is counted
    assert len(note) == 1 and "rounding put 4 elements on the other side" in note[0], names
    prediction = next(c for c in report.comparisons if c.name == "prediction")
    # the float32 run's ReLU is closed, as in the float64 run it is judged against;
    # against the reference (open: 1.95e-10 * 1e9) its error would be 0.195
    assert prediction.max_abs < 1e-6
    grad_c = next(c for c in report.comparisons if c.name == "grad c")
    assert grad_c.max_abs < 1e-6


@pytest.mark.parametrize("target", ["torch", "tensorflow", "jax"])
def test_a_replay_takes_the_recorded_side_of_each_gate(gates_log: Path, target: str) -> None:
    """The float64 run's own decisions replayed give the float64 run; one
    ReLU element flipped in the recording moves that row's prediction and
    c's gradient, and nothing else."""
    ns = _program(gates_log, target)
    sample = ns["_load"](str(gates_log / "sample.safetensors"))
    trainable = [name for name, flag, *_ in ns["PARAMETERS"] if flag]
    plain = ns["_gate_matched"](str(gates_log), sample, trainable, None)
    rows, signs = ns["_translation"](str(gates_log), sample, trainable)
    assert all(r[3] for r in rows) and signs is not None
    assert len(signs) == 6  # relu, clamp (two bounds), leaky_relu, maximum, minimum
    assert signs[0].ravel().tolist() == [1, 1, 1, 1]  # the ReLU, open in float64
    same = ns["_gate_matched"](str(gates_log), sample, trainable, signs)
    for key in plain:
        np.testing.assert_array_equal(same[key], plain[key], err_msg=key)
    closed = [s.copy() for s in signs]
    closed[0].ravel()[1] = -1  # row 1's ReLU closed
    moved = ns["_gate_matched"](str(gates_log), sample, trainable, closed)
    pred = "output/prediction"
    changed = np.argwhere(moved[pred] != plain[pred]).tolist()
    assert changed == [[1, 0]]
    assert moved[pred][1, 0] == 0.0
    assert not np.array_equal(moved["grad/c"], plain["grad/c"])
    np.testing.assert_array_equal(moved["grad/s"][1:], plain["grad/s"][1:])
    # recorded gates that are not this program's: no replay
    assert ns["_gate_matched"](str(gates_log), sample, trainable, signs[:3]) is None


def test_a_jax_check_runs_jitted_and_op_by_op_only_when_asked(
    gates_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows judge the jitted run (as JAX trains); the op-by-op run, whose
    every op compiles on its own, runs only where TRACELOG_JAX_OP_BY_OP=1
    asks, and then once, in float64 (its "(no jit)" translation rows), not
    again in float32 to be thrown away."""
    ns = _program(gates_log, "jax")
    runs: list[tuple[bool, str]] = []
    value_and_grads = ns["_value_and_grads"]

    def counted(step: Any, params: dict[str, Any], trainable: list[str], jit: bool = True) -> Any:
        dtype = next(str(v.dtype) for v in params.values() if hasattr(v, "dtype"))
        runs.append((jit, dtype))
        return value_and_grads(step, params, trainable, jit)

    ns["_value_and_grads"] = counted
    monkeypatch.delenv("TRACELOG_JAX_OP_BY_OP", raising=False)
    rows = ns["check_parity"](str(gates_log))
    assert all(r[3] for r in rows if r[0] and not r[0].startswith("[")), rows
    assert not any("(no jit)" in r[0] for r in rows), rows
    assert sorted(set(runs)) == [(True, "float32"), (True, "float64")], runs

    runs.clear()
    monkeypatch.setenv("TRACELOG_JAX_OP_BY_OP", "1")
    rows = ns["check_parity"](str(gates_log))
    assert all(r[3] for r in rows if r[0] and not r[0].startswith("[")), rows
    jit = [r[0] for r in rows if r[0].endswith("[float64]") and "(no jit)" not in r[0]]
    assert len([r for r in rows if r[0].endswith(" (no jit) [float64]")]) == len(jit) > 0
    assert (False, "float64") in runs
    assert (False, "float32") not in runs, runs
    assert (True, "float32") in runs


class _ZeroBiasRelu(nn.Module):
    """A ReLU whose input is exactly 0 on some rows: a zero bias and zero
    features (Swin V2's relative-coordinate table has such a row)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 8)
        self.head = nn.Linear(8, 3)
        with torch.no_grad():
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc(x)))


@pytest.mark.parametrize("target", ["tensorflow", "jax"])
def test_a_draw_moves_no_zero_to_a_subnormal(tmp_path: Path, target: str) -> None:
    """A draw nudges by one ulp, but a zero stays zero: its neighbours are
    subnormal, which TensorFlow's and XLA's CPU kernels flush to 0 while the
    draw's float64 run keeps their signs, so a ReLU at a zero bias opened in
    the float64 run only (Swin V2's draws read 6e5 times the source's error
    on that bias's gradient)."""
    module = {"jax": "jax", "tensorflow": "tensorflow"}[target]
    pytest.importorskip(module, reason=f"the {target} target needs {module}")
    torch.manual_seed(0)
    model = _ZeroBiasRelu()
    x = torch.randn(8, 2)
    x[::2] = 0.0
    with tracelog.Listener(model, tmp_path / "log", strict=True) as listener:
        with listener.batch():
            F.cross_entropy(model(x), torch.arange(8) % 3).backward()
    for draw in (1, 2):
        report = tracelog.check(tmp_path / "log", target, draw=draw)
        assert report.ok, report.table()
