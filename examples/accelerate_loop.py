"""An ``accelerate`` training loop recorded by the plain listener (CPU).

``accelerate`` needs no callback: the model ``accelerator.prepare`` returns
is the model (or wraps it, and its forward still runs the model's), so
``tracelog.Listener(model, ...)`` and ``listener.batch()`` around each
micro-batch record it. Gradient accumulation through
``accelerator.accumulate``: each micro-batch is a batch of the counts, the
optimizer steps (only every ``--accumulate`` micro-batches) are counted beside.

    python examples/accelerate_loop.py --out runs/accelerate --targets tensorflow jax onnx
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

import tracelog
from tracelog.cli import show_and_check

FEATURES, CLASSES = 16, 4


def train(out: Path, *, epochs: int = 2, accumulate: int = 2) -> tracelog.TraceLog:
    """64 samples in batches of 8, an optimizer step every ``accumulate`` batches."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, CLASSES))
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(
        torch.randn(64, FEATURES, generator=g), torch.randint(0, CLASSES, (64,), generator=g)
    )
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulate)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prepared, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=8))
    with tracelog.Listener(accelerator.unwrap_model(prepared), out, overwrite=True) as listener:
        for _epoch in listener.epochs(epochs):
            for x, y in loader:
                with accelerator.accumulate(prepared):
                    with listener.batch():
                        loss = F.cross_entropy(prepared(x), y)
                        accelerator.backward(loss)
                    opt.step()  # steps only at the end of each accumulation
                    opt.zero_grad()
    return listener.log


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/accelerate"))
    p.add_argument("--targets", nargs="*", default=[], help="check these targets")
    args = p.parse_args(argv)
    train(args.out)
    return show_and_check(args.out, args.targets)


if __name__ == "__main__":
    sys.exit(main())
