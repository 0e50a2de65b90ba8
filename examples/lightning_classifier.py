"""Record a Lightning ``Trainer.fit`` run with ``tracelog.lightning.TracelogCallback``:
a LightningModule whose ``training_step`` calls a submodule (``self.net(x)``),
logs with ``self.log(..., on_epoch=True)``, updates a torchmetrics metric,
and validates each epoch; then show the log and check the translations.

The data are generated (Gaussian blobs, no download); the run takes seconds.

    python examples/lightning_classifier.py --out runs/lightning --targets tensorflow jax onnx
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

from tracelog.cli import show_and_check
from tracelog.lightning import TracelogCallback

FEATURES, CLASSES = 16, 4


class Classifier(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, CLASSES)
        )
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.train_acc(logits.argmax(-1), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.log("train_acc", self.train_acc, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.val_acc.update(logits.argmax(-1), y)
        self.log("val_loss", loss, on_epoch=True)
        self.log("val_acc", self.val_acc, on_epoch=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def blobs(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    centers = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0)) * 2
    return TensorDataset(centers[y] + torch.randn(n, FEATURES, generator=g), y)


def train(out: Path, *, epochs: int = 2, batch_size: int = 16, accumulate: int = 1) -> Classifier:
    """Fit for a few epochs with the callback: 96 training samples (6 batches of
    16) and 40 validation samples (3 batches: 16, 16 and a short one of 8)."""
    torch.manual_seed(0)
    model = Classifier()
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        accumulate_grad_batches=accumulate,
        callbacks=[TracelogCallback(out, overwrite=True)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(
        model,
        DataLoader(blobs(96, 1), batch_size=batch_size),
        DataLoader(blobs(40, 2), batch_size=batch_size),
    )
    return model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/lightning"))
    p.add_argument("--targets", nargs="*", default=[], help="check these targets")
    args = p.parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    train(args.out)
    return show_and_check(args.out, args.targets)


if __name__ == "__main__":
    sys.exit(main())
