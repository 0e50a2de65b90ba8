"""Formulas whose rounding must be no worse than the source kernel's: the
translation check (float64 against torch's float64 replay, within 1e-9 of
each output's scale) fails on a spelling that cancels where torch's kernel
does not."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

from helpers import assert_translated  # noqa: E402

import tracelog  # noqa: E402
from tracelog.emit import targets  # noqa: E402

nn = torch.nn
F = torch.nn.functional


class _OffsetBatchNorm(nn.Module):
    """A batch norm of channels whose mean is 2**23 times their spread: each
    channel half 2**16 + 2**-7, half 2**16 - 2**-7 (exact in float32). The
    batch mean and variance, the output (eps below the variance's ulp; scale
    and bias short binary fractions) are then exact in float64 in either
    spelling, so the translation is judged on the gradient's formula alone."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(3, eps=1e-30)
        self.head = nn.Linear(3, 2)
        with torch.no_grad():
            self.bn.weight.copy_(torch.tensor([0.5, 1.5, -1.0]))
            self.bn.bias.copy_(torch.tensor([0.125, -0.25, 0.375]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.bn(x * 2.0**-7 + 2.0**16)))


def _signs(rows: int, generator: torch.Generator) -> torch.Tensor:
    """Columns of +1 and -1, as many of each, in random order."""
    half = torch.tensor([1.0, -1.0]).repeat_interleave(rows // 2)
    return torch.stack([half[torch.randperm(rows, generator=generator)] for _ in range(3)], 1)


@pytest.mark.parametrize("target", ["tensorflow", "jax", "torch", "onnx"])
def test_batch_norm_scale_gradient_centred(target: str, tmp_path: Path) -> None:
    """Training batch norm's scale gradient is sum(dy * (x - mean)) * invstd in
    torch's backward. Written as x * a + (bias - mean * a), it differentiated
    to sum(dy * x) - mean * sum(dy), which cancels by |mean| / std: 1e-9 of
    the gradient here (textnet's JAX and TensorFlow programs read 6e-13
    against its PyTorch program's 1e-14)."""
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = _OffsetBatchNorm()
    with tracelog.Listener(model, tmp_path, mode="exact", strict=True) as listener:
        for _ in range(2):
            with listener.batch():
                x = _signs(16, generator)
                F.cross_entropy(model(x), torch.arange(16) % 2).backward()
            model.zero_grad()
    assert_translated(tracelog.check(tmp_path, target))
