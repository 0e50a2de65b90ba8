"""How the batch-dim replay (adapters/torch/batch_dims.py, adapters/symbols.py)
reads an int that several sizes explain: a length of 8 beside a batch of 4 in
a one-hot's zeros, an expand's sizes where its input keeps them, and a slice
of data from -n that keeps the input whole. Each model records batches of two
lengths; one graph pair with the length a symbol shows the readings were
right (a reading that fails leaves the length a number: a graph per length)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import load_whole

import tracelog
from tracelog.adapters.tape import TArg
from tracelog.adapters.torch import batch_dims


def _record(tmp_path: Path, model: nn.Module, batches: list[tuple[Any, ...]]) -> Any:
    torch.manual_seed(0)
    with tracelog.Listener(model, tmp_path, mode="exact", strict=True) as listener:
        for *inputs, y in batches:
            with listener.batch():
                F.cross_entropy(model(*inputs), y).backward()
            model.zero_grad()
    return load_whole(tmp_path)


def _one_pair_over_lengths(log: Any) -> None:
    pairs = [p for p in log.pairs.values() if p.phase == "train"]
    inputs = [[str(i.type) for i in log.graph(p.prediction).inputs] for p in pairs]
    assert len(pairs) == 1, inputs
    assert all("seq" in t for t in inputs[0][:1]), inputs


class _Top1Router(nn.Module):
    """Switch's router over [B, T, 16]: a one-hot over 4 experts (torch's
    one_hot makes zeros([B, T, 4]) from the sizes), its cumulative count per
    expert capped, and the tokens routed found by nonzero, whose count meets
    no other size. With B = 4 and T = 8, the one-hot's 8 reads as 2 * batch
    and as the length, and its 4s as the batch and as the experts."""

    def __init__(self) -> None:
        super().__init__()
        self.router, self.expert, self.out = nn.Linear(16, 4), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(self.router(x), dim=-1)
        onehot = F.one_hot(probs.argmax(-1), 4)
        kept = onehot * (torch.cumsum(onehot, dim=-2) <= 5)
        tokens = x.reshape(-1, 16)
        rows, experts = torch.where(kept.reshape(-1, 4))
        routed = self.expert(tokens[rows]) * probs.reshape(-1, 4)[rows, experts, None]
        y = torch.zeros_like(tokens).index_add(0, rows, routed)
        return self.out(y.reshape(x.shape).mean(1))


def test_a_length_twice_the_batch_is_read_as_each_replay_alone_read_it(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, t, 16, generator=g), torch.arange(4) % 3) for t in (8, 6)]
    log = _record(tmp_path, _Top1Router(), batches)
    _one_pair_over_lengths(log)
    report = tracelog.check(tmp_path, "torch")
    assert report.ok, report.table()


class _LastTokens(nn.Module):
    """NLLB-MoE's router mask: a [B, T] mask flattened, cut to its last B*T
    tokens (`mask.reshape(-1)[-n:]`, n the number of tokens), all of it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        tokens = self.fc(x).reshape(-1, 8)
        kept = mask.reshape(-1)[-tokens.shape[0] :].unsqueeze(-1).to(tokens.dtype)
        return self.out((tokens * kept).reshape(x.shape[0], -1, 8).mean(1))


def test_a_slice_of_data_from_minus_its_length_keeps_it_whole(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    batches = []
    for t in (10, 7):
        mask = torch.ones(4, t, dtype=torch.long)
        mask[1, -2:] = 0
        batches.append((torch.randn(4, t, 8, generator=g), mask, torch.arange(4) % 3))
    log = _record(tmp_path, _LastTokens(), batches)
    _one_pair_over_lengths(log)
    report = tracelog.check(tmp_path, "torch")
    assert report.ok, report.table()


@pytest.mark.parametrize(
    ("recorded", "replayed", "sizes", "want", "slots"),
    [
        # every dim of the input kept: its replayed sizes, no reading of its own
        ((4, 2, 16, 8), (5, 2, 16, 9), (4, 2, 16, 8), [5, 2, 16, 9], 0),
        # a new leading dim and a dim of 1 broadcast: read as a size list's ints
        # (the 4 as the batch: slot 0; the 3 no size's multiple), the others kept
        ((1, 2, 8), (1, 2, 9), (3, 4, 2, 8), [3, 0, 2, 9], 1),
    ],
)
def test_an_expand_takes_its_input_s_kept_dims_as_they_replay(
    recorded: tuple[int, ...],
    replayed: tuple[int, ...],
    sizes: tuple[int, ...],
    want: list[int] | None,
    slots: int,
) -> None:
    replay = batch_dims._MetaReplay(4, {"batch": 5, "seq": 9}, {"seq": (8, [])})
    source = TArg(("o", 0, 0), "float32", recorded)
    replay.metas[source.ref] = torch.empty(replayed, device="meta")
    rec = SimpleNamespace(op="aten.expand.default", args=(source, sizes))
    found: list[tuple[int, list[int]]] = []
    got = replay._expanded(rec, sizes, found)
    assert len(found) == slots, found
    if want is not None:
        assert got == want
