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

import numpy as np  # noqa: E402

import tracelog  # noqa: E402
from tracelog.verify import run_graph  # noqa: E402

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


class _ShiftedPositions(nn.Module):
    """Positions T..2T-1: arange's start and end both follow the length."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        positions = torch.arange(t, 2 * t, 1).float()
        return self.fc(x + positions[None, :, None] * 0.01).mean(dim=1)


def test_an_arange_from_a_size_is_not_shared_wrong(tmp_path: Path) -> None:
    """arange(T, 2T): the replay read both bounds as following T, so the
    length was `seq`, while the rule writes the start as the recorded number
    (9): each length's graph said any length and computed other lengths'
    positions off by the difference (0.008 on T = 10 from the T = 9 graph).
    A start is never read as following a size now: such a graph keeps its
    length, and every graph that says a symbolic length computes the model's
    output at another one."""
    torch.manual_seed(0)
    model = _ShiftedPositions()
    with tracelog.Listener(model, tmp_path, mode="exact") as listener:
        for t in (9, 10):
            with listener.batch():
                F.cross_entropy(model(torch.randn(4, t, 8)), torch.arange(4) % 3).backward()
            model.zero_grad()
    log = tracelog.load(tmp_path)
    assert log.unrecorded == 0, log.failures
    for graph in log.graphs.values():
        assert "tracelog.Unsupported" not in graph.op_histogram()
        if graph.kind != "prediction":
            continue
        (x_name,) = [v.name for v in graph.values.values() if v.kind == "input"]
        if not any(isinstance(d, str) and "seq" in d for d in graph.values[x_name].type.shape):
            continue  # a length of its own: it says nothing of other lengths
        for t in (9, 10, 11):
            x = torch.randn(4, t, 8)
            feeds = {x_name: x.numpy()}
            feeds.update({n: p.detach().numpy() for n, p in model.named_parameters()})
            (got,) = run_graph(graph, feeds, constants=log.constants).values()
            want = model(x).detach().numpy()
            assert np.abs(got - want).max() < 1e-5, (t, np.abs(got - want).max())
