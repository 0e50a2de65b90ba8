"""Ops a forward runs inside torch.no_grad() carry no gradient back, in the
source and in every program: a record autograd did not record is read by one
it did through a StopGradient, and the float64 reference replays it without
grad. Spectral norm's power iteration (torch.div(..., out=u) into its
buffers, torch.vdot) is the everyday case. A custom autograd Function's body
also runs without grad, but its outputs require grad: it is differentiated
as recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402
from tracelog.emit import targets  # noqa: E402

F = torch.nn.functional
TARGETS = ["onnx", "torch", "tensorflow", "jax"]


class _Rescaled(torch.nn.Module):
    """A layer's output divided by its weight's norm taken without grad (the
    gradient differs wherever the norm's own gradient leaks through)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            scale = self.fc.weight.norm() + self.fc.weight.mean().abs()
        return self.head(torch.relu(self.fc(x)) / scale)


class _Affine(torch.autograd.Function):
    """A custom Function of several ops: its forward runs without grad, and
    its backward is the forward's derivative."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        doubled = x * 2.0
        return doubled + 1.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2.0


class _WithFunction(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(_Affine.apply(self.fc(x))))


def _spectral() -> torch.nn.Module:
    sn = torch.nn.utils.parametrizations.spectral_norm
    return torch.nn.Sequential(sn(torch.nn.Linear(6, 8)), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _record(target: str, tmp_path: Path, model: torch.nn.Module) -> Any:
    """Two training batches and an eval batch recorded; the target's check of
    the sample (the report), which must pass on its float64 rows."""
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tracelog.Listener(model, tmp_path, strict=True) as listener:
        for _ in range(2):
            with listener.batch():
                F.cross_entropy(model(torch.randn(10, 6)), torch.arange(10) % 3).backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        with torch.no_grad(), listener.batch():
            model(torch.randn(10, 6))
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    assert log.sample_info is not None and log.sample_info["reference"] == "float64"
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    if target != "onnx":  # model.onnx is the forward and the loss: no gradients
        assert any(c.name.startswith("grad ") for c in translated)
    assert translated and all(c.ok for c in translated)
    return report


@pytest.mark.parametrize("target", TARGETS)
def test_a_value_taken_without_grad_carries_no_gradient(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _record(target, tmp_path, _Rescaled())
    log = tracelog.load(tmp_path)
    by_phase = {e.phase: e for e in log.entries_sorted() if e.kind == "prediction"}
    train = log.graphs[by_phase["train"].hash].op_histogram()
    evaluated = log.graphs[by_phase["eval"].hash].op_histogram()
    assert train.get("tracelog.StopGradient", 0) >= 1
    # a forward wholly inside no_grad reads nothing autograd recorded: no cut
    assert "tracelog.StopGradient" not in evaluated


@pytest.mark.parametrize("target", TARGETS)
def test_spectral_norm_translates_with_its_power_iteration(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    report = _record(target, tmp_path, _spectral())
    updated = {c.name for c in report.comparisons if c.name.startswith("update:")}
    assert any(name.endswith("._u [float64]") for name in updated), updated
    assert any(name.endswith("._v [float64]") for name in updated), updated


@pytest.mark.parametrize("target", TARGETS)
def test_a_custom_functions_body_is_differentiated(target: str, tmp_path: Path) -> None:
    """A custom autograd Function's forward runs without grad too, but its
    output requires grad: its body is differentiated as recorded (no
    StopGradient cuts the gradient to fc)."""
    torch.manual_seed(0)
    _record(target, tmp_path, _WithFunction())
    log = tracelog.load(tmp_path)
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.StopGradient" not in ops, ops
