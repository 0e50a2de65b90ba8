"""Ops and losses common in training code that the aten table had no rule
for (found by trying them): xlogy (F.kl_div), logaddexp, sinc, sgn, addcmul,
addcdiv, clamp by tensors, vector norms of any order, cdist, median,
kthvalue, pixel and channel shuffles, LSTMCell and GRUCell, Bilinear,
reflection and replication padding, and the smooth L1, Huber, soft-margin and multi-margin losses.
Each records with no unsupported node and translates on every target, with
the float64 verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402
from tracelog.adapters.torch import TorchListener  # noqa: E402
from tracelog.emit import targets  # noqa: E402

F = torch.nn.functional
TARGETS = ["onnx", "torch", "tensorflow", "jax"]


class _Ops(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 16)
        self.head = torch.nn.Linear(16, 5)
        self.prototypes = torch.nn.Parameter(torch.randn(5, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        n = h.shape[0]
        lo, hi = -h.abs().mean(0), h.abs().mean(0) * 0.5
        terms = [
            torch.logaddexp(h, h.flip(-1)),
            torch.sinc(h),
            torch.sgn(h) * h,
            torch.addcmul(h, h, h.flip(-1), value=0.25),
            torch.addcdiv(h, h, h.abs() + 1, value=-0.5),
            torch.clamp(h, min=lo, max=hi),
            torch.clamp(h, max=hi),
            torch.special.xlogy(h.abs(), h.abs() + 1),
            torch.special.xlogy(2.0, h.abs() + 1),
            h / torch.linalg.vector_norm(h, 3, dim=-1, keepdim=True),
            h / torch.linalg.vector_norm(h, 0.5, dim=-1, keepdim=True),
            h * torch.linalg.vector_norm(torch.relu(h), 0, dim=-1, keepdim=True) / 16,
            F.pixel_shuffle(h.view(n, 4, 2, 2), 2).reshape(n, 16),
            F.pixel_unshuffle(h.view(n, 1, 4, 4), 2).reshape(n, 16),
            F.channel_shuffle(h.view(n, 4, 2, 2), 2).reshape(n, 16),
            torch.cdist(h, self.prototypes).sum(-1, keepdim=True) * 0.01,
            torch.cdist(h, self.prototypes, p=1).mean(-1, keepdim=True) * 0.01,
            h.median(-1, keepdim=True).values,
            h.kthvalue(3, -1).values.unsqueeze(-1),
        ]
        total = h
        for term in terms:
            total = total + term
        return self.head(total)


class _Layers(torch.nn.Module):
    """torch.nn layers whose kernels had no rule: LSTMCell and GRUCell (their
    gates split by unsafe_split), Bilinear (_trilinear), reflection and
    replication padding, instance norm (a batch norm over [1, B*C, ...]),
    Dropout2d and Dropout1d (a keep draw per sample and channel)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)
        self.lstm = torch.nn.LSTMCell(8, 8)
        self.gru = torch.nn.GRUCell(8, 8)
        self.bilinear = torch.nn.Bilinear(8, 8, 8)
        self.reflect = torch.nn.ReflectionPad2d((1, 1, 1, 0))
        self.replicate = torch.nn.ReplicationPad1d((2, 1))
        self.reflect1 = torch.nn.ReflectionPad1d(3)
        self.instance = torch.nn.InstanceNorm2d(2)
        self.instance_affine = torch.nn.InstanceNorm1d(2, affine=True)
        self.drop2d, self.drop1d = torch.nn.Dropout2d(0.3), torch.nn.Dropout1d(0.5)
        self.head = torch.nn.Linear(8 + 24 + 11 + 20, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        n = h.shape[0]
        state = self.lstm(h)
        h = h + self.gru(h, state[0]) + self.lstm(h, state)[1]
        h = h + self.bilinear(h, torch.tanh(h))
        h = h + self.instance(h.view(n, 2, 2, 2)).reshape(n, 8)
        h = h + self.instance_affine(h.view(n, 2, 4)).reshape(n, 8)
        h = self.drop2d(h.view(n, 4, 2, 1)).reshape(n, 8) + self.drop1d(h.view(n, 4, 2)).reshape(
            n, 8
        )
        padded = [
            self.reflect(h.view(n, 2, 2, 2)).reshape(n, 24),
            self.replicate(h.view(n, 1, 8)).reshape(n, 11),
            self.reflect1(h.view(n, 2, 4)).reshape(n, 20),
        ]
        return self.head(torch.cat([h, *padded], -1))


def _losses(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Every newly ruled loss of 5-class scores `p` and labels `y`, summed."""
    soft = F.softmax(p.detach().flip(-1), -1)
    signs = (y.unsqueeze(1) == torch.arange(5)).float() * 2 - 1
    return (
        F.kl_div(F.log_softmax(p, -1), soft, reduction="batchmean")
        + F.smooth_l1_loss(p, soft, beta=0.5)
        + F.smooth_l1_loss(p, soft, beta=0.0)
        + F.huber_loss(p, soft, delta=0.3, reduction="sum")
        + F.soft_margin_loss(p, signs)
        + F.multi_margin_loss(p, y)
        + F.multi_margin_loss(p, y, p=2, margin=0.5, weight=torch.linspace(0.5, 1.5, 5))
    )


def _check(target: str, tmp_path: Path, model: torch.nn.Module, loss: Any) -> Any:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    x, y = torch.randn(12, 6) * 2, torch.arange(12) % 5
    with TorchListener(model, tmp_path, strict=True) as listener, listener.batch():
        loss(model(x), y).backward()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "tracelog.Unsupported" not in ops and "Unsupported" not in ops, ops
    report = tracelog.check(tmp_path, target)
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)
    return log


@pytest.mark.parametrize("target", TARGETS)
def test_elementwise_norm_and_shuffle_ops_translate(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Ops(), F.cross_entropy)


@pytest.mark.parametrize("target", TARGETS)
def test_cells_bilinear_and_padding_layers_translate(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Layers(), F.cross_entropy)


@pytest.mark.parametrize("target", TARGETS)
def test_kl_smooth_l1_huber_and_margin_losses_translate(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, torch.nn.Linear(6, 5), _losses)
