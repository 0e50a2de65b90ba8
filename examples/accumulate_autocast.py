"""Gradient accumulation and bfloat16 autocast in a plain PyTorch loop, recorded.

With ``--accumulate 2`` each ``listener.batch()`` window holds two micro-batches
(forward and backward each) before one optimizer step: each forward is a batch
of the graphs' counts, the optimizer steps are counted beside them, and the
sample is one micro-batch with its own gradients. With ``--bf16`` the forward
and the loss run under ``torch.autocast("cpu", dtype=torch.bfloat16)``: the
casts autocast inserts are ops of the graphs, and the targets run them: in
bfloat16 where torch ran bfloat16.

    python examples/accumulate_autocast.py --out runs/accum --accumulate 2 --targets tensorflow jax onnx
    python examples/accumulate_autocast.py --out runs/bf16 --bf16 --targets tensorflow jax onnx
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import tracelog
from tracelog.cli import show_and_check

FEATURES, CLASSES = 16, 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 32)
        self.norm = nn.LayerNorm(32)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(F.gelu(self.norm(self.fc1(x)))))


def train(
    out: Path, *, steps: int = 4, accumulate: int = 1, bf16: bool = False, batch_size: int = 8
) -> tracelog.TraceLog:
    """``steps`` optimizer steps of ``accumulate`` micro-batches each, every
    step's micro-batches in one window; then one eval batch."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    data = [
        (
            torch.randn(batch_size, FEATURES, generator=g),
            torch.randint(0, CLASSES, (batch_size,), generator=g),
        )
        for _ in range(steps * accumulate)
    ]

    def autocast() -> contextlib.AbstractContextManager[object]:
        return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    with tracelog.Listener(model, out, overwrite=True) as listener:
        for step in range(steps):
            with listener.batch():
                for x, y in data[step * accumulate : (step + 1) * accumulate]:
                    with autocast():
                        loss = F.cross_entropy(model(x), y) / accumulate
                    loss.backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        with torch.no_grad(), listener.batch(), autocast():
            F.cross_entropy(model(data[0][0]), data[0][1])
    return listener.log


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/accumulate"))
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast on CPU")
    p.add_argument("--targets", nargs="*", default=[], help="check these targets")
    args = p.parse_args(argv)
    train(args.out, accumulate=args.accumulate, bf16=args.bf16)
    return show_and_check(args.out, args.targets)


if __name__ == "__main__":
    sys.exit(main())
