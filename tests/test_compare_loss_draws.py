"""`tracelog compare` on logs whose loss graph draws (a dropout applied in the
loss function): A's recorded loss-graph masks are fed to B, as its
prediction masks are, so two recordings of one model that drew different
masks still agree in float64."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tracelog

pytest.importorskip("jax", reason="compare runs each log's JAX program")


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.dropout(out, 0.5, training=True), y)


def _record(seed: int, log_dir: Path, extra: bool = False) -> tracelog.TraceLog:
    torch.manual_seed(0)  # one set of weights for both recordings
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.25), nn.Linear(8, 3))
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    torch.manual_seed(seed)  # the draws differ between the two recordings
    listener = tracelog.Listener(model, log_dir, strict=True)
    with listener.batch():
        out = model(x)
        loss = _loss(out, y)
        if extra:  # a second loss-graph draw
            loss = loss + F.dropout(out, 0.5, training=True).square().mean()
        loss.backward()
    return listener.close()


@pytest.mark.parametrize("extra", [False, True])
def test_loss_graph_masks_are_fed_to_b(tmp_path: Path, extra: bool) -> None:
    a = _record(1, tmp_path / "a", extra)
    b = _record(2, tmp_path / "b", extra)
    sa, sb = a.sample(), b.sample()
    assert "loss_mask/0" in sa and not (sa["loss_mask/0"] == sb["loss_mask/0"]).all()
    assert not (sa["mask/0"] == sb["mask/0"]).all()
    result = tracelog.compare(a, b)
    assert result.equal, tracelog.compare.dumps(result, "text")
