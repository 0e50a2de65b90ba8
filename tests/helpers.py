"""Recording helpers shared by the tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

import tracelog
from tracelog.adapters.torch import TorchListener


def record(
    model: torch.nn.Module,
    log_dir: Path,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    epochs: int = 1,
    eval_batches: int = 1,
    strict: bool = True,
    lr: float = 0.05,
) -> tracelog.TraceLog:
    """Train for real with a listener attached, then run eval batches."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    listener = TorchListener(model, log_dir, strict=strict)
    for _epoch in listener.epochs(epochs):
        model.train()
        for x, y in batches:
            with listener.batch():
                loss = loss_fn(model(x), y)
                loss.backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        with torch.no_grad():
            for x, y in batches[:eval_batches]:
                with listener.batch():
                    loss_fn(model(x), y)
    return listener.close()
