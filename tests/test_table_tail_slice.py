"""A table of fixed length cut to its last T entries (MPT's ALiBi bias: a
bias for 40 positions, `bias[:, :, 40 - T:]`). The slice's start is
`40 - T`: the batch-dim replay reads it as following the sequence (the
length kept is the symbol's size), and the graph computes it, so batches of
two lengths share one graph (MPT recorded one per length before)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

from helpers import assert_translated  # noqa: E402

import tracelog  # noqa: E402
from tracelog.emit import TARGETS, targets  # noqa: E402

nn = torch.nn
F = torch.nn.functional
TABLE = 40


class _TailBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.register_buffer("bias", torch.linspace(-1.0, 0.0, TABLE).view(1, 1, TABLE))
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        length = ids.shape[1]
        bias = self.bias[:, :, max(0, self.bias.size(2) - length) :]  # as MPT computes it
        scores = self.q(h) @ self.k(h).transpose(1, 2) + bias
        return self.head((torch.softmax(scores, -1) @ h).mean(1))


def _record(log_dir: Path) -> Path:
    torch.manual_seed(0)
    model = _TailBias()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    with tracelog.Listener(model, log_dir, strict=True) as listener:
        for length in (9, 12):
            ids, y = torch.randint(0, 11, (4, length), generator=g), torch.randint(0, 3, (4,))
            with listener.batch():
                F.cross_entropy(model(ids), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    return log_dir


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("tail"))


def test_both_lengths_share_one_graph(recorded: Path) -> None:
    log = tracelog.load(recorded)
    assert len(log.graphs) == 2, [g.kind for g in log.graphs.values()]
    (pred,) = [g for g in log.graphs.values() if g.kind == "prediction"]
    assert [v.type.shape for v in pred.inputs] == [("batch", "seq")]
    ops = pred.op_histogram()
    assert "Unsupported" not in ops and ops.get("Slice", 0) >= 1


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_translates(recorded: Path, target: str) -> None:
    framework = targets.get(target).framework
    pytest.importorskip(framework, reason=f"the {target} target needs {framework} installed")
    assert_translated(tracelog.check(recorded, target))
