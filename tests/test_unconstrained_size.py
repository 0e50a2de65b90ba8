"""A record whose size follows a symbol but that no later record constrains:
BART's decoder builds `torch.ones(batch, target_length)` as its default
attention mask and only asks `.all()` of it. The batch-dim replays of the
other symbols could read either int of its size list as following or not;
they must read it alike in every replay, or the fit of the target length
fails its check and every length gets a graph of its own (BART, mBART,
Pegasus, Marian and BlenderbotSmall gave 4 graphs for 2 batches)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import tracelog  # noqa: E402

F = torch.nn.functional
nn = torch.nn


class _EncoderDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(8, 8)
        self.decoder = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(y.shape[0], y.shape[1])  # read by .all() alone
        h = self.decoder(y)
        if not mask.all():
            h = h * mask[..., None]
        return self.head(self.encoder(x).mean(dim=1) + h.mean(dim=1))


def test_an_unconstrained_size_follows_its_symbol_in_every_replay(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _EncoderDecoder()
    with tracelog.Listener(model, tmp_path, mode="exact", strict=True) as listener:
        for b, t, t2 in [(4, 10, 6), (4, 9, 5), (3, 7, 11)]:
            with listener.batch():
                out = model(torch.randn(b, t, 8), torch.randn(b, t2, 8))
                F.cross_entropy(out, torch.arange(b) % 3).backward()
            model.zero_grad()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    kinds = sorted(g.kind for g in log.graphs.values())
    assert kinds == ["loss", "prediction"], kinds  # one graph pair for the three batches
    prediction = next(g for g in log.graphs.values() if g.kind == "prediction")
    shapes = {v.name: v.type.shape for v in prediction.values.values() if v.kind == "input"}
    assert sorted(shapes.values()) == [("batch", "seq", 8), ("batch", "seq2", 8)], shapes
