"""A boolean mask the forward makes from outside torch, per batch (SpecAugment:
the wav2vec2 family's time mask, drawn by numpy, then torch.tensor): a data
input of the graph, its value the batch's in the sample. As a constant, each
batch's draw made a graph of its own and turned the run to exact mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402
from tracelog.emit import TARGETS, targets  # noqa: E402

nn = torch.nn
F = nn.functional


class _SpecAugmented(nn.Module):
    """Frames [B, T, 8] projected, a random span of frames per example
    replaced by a learned vector (the span drawn by numpy, as transformers'
    _compute_mask_indices does), pooled and classified."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.out = nn.Linear(8, 16), nn.Linear(16, 3)
        self.masked = nn.Parameter(torch.randn(16))
        self.rng = np.random.default_rng(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        if self.training:
            n, frames = x.shape[:2]
            mask = np.zeros((n, frames), dtype=bool)
            for i, start in enumerate(self.rng.integers(0, frames - 2, size=n)):
                mask[i, start : start + 2] = True
            h[torch.tensor(mask, device=x.device)] = self.masked
        return self.out(torch.relu(h).mean(1))


def _train(log_dir: Path, lengths: list[int], **options: object) -> tracelog.TraceLog:
    torch.manual_seed(0)
    model = _SpecAugmented()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with tracelog.Listener(model, log_dir, strict=True, **options) as listener:
        for frames in lengths:
            x, y = torch.randn(4, frames, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
            with listener.batch():
                F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return tracelog.load(log_dir)


def test_a_mask_drawn_outside_torch_is_an_input_and_batches_share_a_graph(tmp_path: Path) -> None:
    log = _train(tmp_path / "g", [10] * 8)
    assert len(log.pairs) == 1  # one graph pair for eight draws (was one per batch)
    assert log.recording is not None and log.recording["switched_to_exact"] is None
    assert log.recording["guarded"] > 0
    pred = log.graph(log.sample_info["prediction"])
    inputs = {v.name: v.type for v in pred.values.values() if v.kind == "input"}
    assert inputs["external_mask_0"].dtype == "bool"
    assert inputs["external_mask_0"].shape == ("batch", "seq")  # as x's frames
    assert "Where" in [n.op for n in pred.nodes]  # h[mask] = v, over the mask
    exact = _train(tmp_path / "e", [10] * 8, mode="exact")
    assert [(p.usage.batches, p.usage.guarded) for p in log.pairs.values()] == [
        (8, 5)
    ]  # K = 3 exact
    assert [p.usage.batches for p in exact.pairs.values()] == [8]


def test_the_mask_follows_the_sequence_length(tmp_path: Path) -> None:
    """Frames of 10 and 7: the mask's frames are the data's (seq), not a size
    of their own: one graph pair, run at both lengths by the check's batch."""
    log = _train(tmp_path / "s", [10, 7, 10, 7])
    pred = log.graph(log.sample_info["prediction"])
    inputs = {v.name: v.type.shape for v in pred.values.values() if v.kind == "input"}
    assert inputs["x"] == ("batch", "seq", 8) and inputs["external_mask_0"] == ("batch", "seq")
    assert len(log.pairs) == 1


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_takes_the_batchs_mask(tmp_path: Path, target: str) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    _train(tmp_path / "t", [10, 10])
    report = tracelog.check(tmp_path / "t", target)
    assert report.ok, report.table()
    errors = [c.source_err for c in report.comparisons if c.source_err is not None]
    assert errors and max(errors) < 1e-5, report.table()
