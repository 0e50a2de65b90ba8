"""The float64 reference of a custom autograd Function whose forward writes in
place into a tensor autograd tracks, as DeBERTa's and SEW-D's XSoftmax does
(masked_fill, softmax, then masked_fill_ of softmax's output; its backward is
softmax's). Replayed in place, the write clobbered the output softmax's
backward saved, and the sample had no reference at all. The replay writes
out of place, with torch's gradient through a no-grad write (the tensor's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402
from tracelog.emit import TARGETS, targets  # noqa: E402
from tracelog.sample import grad_key, reference_key  # noqa: E402

nn = torch.nn


class XSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:  # type: ignore[override]
        ctx.dim = dim
        rmask = ~mask.to(torch.bool)
        out = torch.softmax(x.masked_fill(rmask, torch.finfo(x.dtype).min), dim)
        out.masked_fill_(rmask, 0)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        (out,) = ctx.saved_tensors
        return torch._softmax_backward_data(grad, out, ctx.dim, out.dtype), None, None


class _MaskedAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6)
        self.out = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(1, 2) / 6**0.5
        probs = XSoftmax.apply(scores, mask[:, None, :], -1)
        return self.out((probs @ self.v(x)).mean(1))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log_dir = tmp_path_factory.mktemp("xsoftmax")
    torch.manual_seed(0)
    model = _MaskedAttention()
    x, y = torch.randn(3, 5, 6), torch.randn(3, 2)
    mask = torch.ones(3, 5, dtype=torch.long)
    mask[0, 3:] = 0
    with tracelog.Listener(model, log_dir, strict=True) as listener, listener.batch():
        nn.functional.mse_loss(model(x, mask), y).backward()
    return log_dir


def test_the_reference_has_every_gradient(recorded: Path) -> None:
    log = tracelog.load(recorded)
    assert log.sample_info["reference"] == "float64", log.sample_info
    sample = log.sample()
    grads = [k for k in sample if k.startswith(grad_key(""))]
    assert len(grads) == 8
    # the source's own float32 gradients against the float64 ones, at the gradients'
    # scale (k.bias's is 0 in exact arithmetic: a softmax does not see a shift)
    scale = max(float(np.abs(sample[reference_key(k)]).max()) for k in grads)
    for key in grads:
        got, ref = sample[key].astype(np.float64), sample[reference_key(key)]
        assert np.abs(got - ref).max() <= 1e-6 * scale, key


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_translates(recorded: Path, target: str) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    report = tracelog.check(recorded, target)
    assert report.ok, report.table()
    assert any("[float64]" in c.name for c in report.comparisons)
