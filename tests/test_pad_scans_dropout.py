"""Training-code constructs whose kernels write into uninitialised memory or
draw masks read as numbers, and the running scans: circular padding (1d, 2d,
3d; torch's _pad_circular fills a new_empty tensor through slice views),
logcumsumexp (stable at +-80 in float32), cummax and cummin (values and
indices), AlphaDropout and FeatureAlphaDropout (their keep masks shifted and
scaled), block_diag, max unpooling (by max pooling's indices) and the
multilabel margin loss. Each records with no unsupported node and translates
on every target, with the float64 verdict."""

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


class _Circular(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)
        self.conv = torch.nn.Conv2d(2, 2, 3, padding=1, padding_mode="circular")
        self.conv1 = torch.nn.Conv1d(2, 1, 3, padding=2, padding_mode="circular")
        self.head = torch.nn.Linear(8 + 6 + 24 + 20 + 36, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        n = h.shape[0]
        parts = [
            self.conv(h.view(n, 2, 2, 2)).reshape(n, 8),
            self.conv1(h.view(n, 2, 4)).reshape(n, 6),
            F.pad(h.view(n, 2, 4), (2, 1), mode="circular").reshape(n, 14)[:, :12].repeat(1, 2),
            F.pad(h.view(n, 1, 2, 4), (1, 0, 1, 2), mode="circular").reshape(n, 25)[:, :20],
            F.pad(h.view(n, 1, 2, 2, 2), (1, 1, 0, 1, 1, 0), mode="circular").reshape(n, 36),
        ]
        return self.head(torch.cat(parts, -1))


class _Scans(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)
        self.head = torch.nn.Linear(8, 5)
        self.block = torch.nn.Parameter(torch.randn(3, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        big = torch.cat([h * 40, -h * 40], -1)  # values near +-80: exp overflows float32
        top = torch.cummax(h, 1)
        low = torch.cummin(h.view(-1, 2, 4), 1)
        diag = torch.block_diag(self.block, self.block[:1], self.block[0, :1].sum())
        terms = [
            torch.logcumsumexp(big, 1)[:, 8:] / 40,
            torch.logcumsumexp(h.view(-1, 2, 4), 2).reshape(h.shape) * 0.1,
            top.values,
            h.gather(1, top.indices) * 0.5,
            low.values.reshape(h.shape) + low.indices.reshape(h.shape).float(),
            diag.sum(0).repeat(2)[:8] * h,
        ]
        total = h
        for term in terms:
            total = total + term
        return self.head(total)


class _AlphaDropouts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)
        self.alpha = torch.nn.AlphaDropout(0.3)
        self.feature = torch.nn.FeatureAlphaDropout(0.4)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.selu(self.fc(x))
        n = h.shape[0]
        return self.head(self.alpha(h) + self.feature(h.view(n, 4, 2)).reshape(n, 8))


class _Unpool(torch.nn.Module):
    """Max unpooling by max pooling's indices: overlapping windows (an index
    repeated), padding, and a 1-d pool in ceil mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 32)
        self.pool = torch.nn.MaxPool2d(3, stride=2, padding=1, return_indices=True)
        self.unpool = torch.nn.MaxUnpool2d(3, stride=2, padding=1)
        self.pool1 = torch.nn.MaxPool1d(2, ceil_mode=True, return_indices=True)
        self.unpool1 = torch.nn.MaxUnpool1d(2)
        self.head = torch.nn.Linear(32 + 7, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        n = h.shape[0]
        pooled, at = self.pool(h.view(n, 2, 4, 4))
        up = self.unpool(pooled, at, output_size=(4, 4)).reshape(n, 32)
        pooled1, at1 = self.pool1(h.view(n, 1, 32)[:, :, :7])
        up1 = self.unpool1(pooled1, at1, output_size=(7,)).reshape(n, 7)
        return self.head(torch.cat([h + up, up1], -1))


def _multilabel(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Labels read up to the first -1 (one listed twice, one after the end)."""
    labels = torch.stack([y, (y + 2) % 5, y, torch.full_like(y, -1), (y + 1) % 5], 1)
    return F.cross_entropy(p, y) + F.multilabel_margin_loss(p, labels)


def _check(target: str, tmp_path: Path, model: torch.nn.Module, loss: Any = F.cross_entropy) -> Any:
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
    print(report.table())
    assert report.ok, report.table()
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and all(c.ok for c in translated)
    return log


@pytest.mark.parametrize("target", TARGETS)
def test_circular_padding_translates(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Circular())


@pytest.mark.parametrize("target", TARGETS)
def test_logcumsumexp_cummax_cummin_and_block_diag_translate(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Scans())


@pytest.mark.parametrize("target", TARGETS)
def test_alpha_dropouts_translate_with_the_masks_drawn(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    log = _check(target, tmp_path, _AlphaDropouts())
    ops = set().union(*(g.op_histogram() for g in log.graphs.values()))
    assert "Dropout" in ops, ops


@pytest.mark.parametrize("target", TARGETS)
def test_max_unpool_and_multilabel_margin_loss_translate(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _check(target, tmp_path, _Unpool(), _multilabel)


class _ReadsUnwritten(torch.nn.Module):
    """Reads two columns of an empty tensor it never wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)
        self.head = torch.nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        wide = h.new_empty(h.shape[0], 10)
        wide[:, :8] = h
        return self.head(wide)


def test_an_empty_read_where_never_written_fails_the_translation_check(tmp_path: Path) -> None:
    # the translation reads unwritten memory as zeros, the float64 reference as NaN:
    # the check fails rather than agree with whatever the memory held
    torch.manual_seed(0)
    model = _ReadsUnwritten()
    with TorchListener(model, tmp_path, strict=True) as listener, listener.batch():
        F.cross_entropy(model(torch.randn(12, 6)), torch.arange(12) % 5).backward()
    report = tracelog.check(tmp_path, "torch")
    translated = [c for c in report.comparisons if c.name.endswith(" [float64]")]
    assert translated and not any(c.ok for c in translated)
    assert not report.ok
