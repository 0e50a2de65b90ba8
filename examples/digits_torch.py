"""Record 3 epochs of real PyTorch training on scikit-learn's digits (1,797
8x8 images shipped with scikit-learn, no download), for an MLP and for a
small CNN with batch norm and dropout; show the deduplicated graphs; then
replay the recorded batch through the IR on onnxruntime and check parity.

    python examples/digits_torch.py --out runs/digits
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import tracelog
from tracelog.cli import show_text
from tracelog.verify import verify


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64)
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.flatten(x, 1)
        h = F.relu(self.fc1(h))
        h = self.drop(F.relu(self.fc2(h)))
        return self.out(h)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)  # 8x8 -> 4x4
        h = F.max_pool2d(F.relu(self.bn2(self.conv2(h))), 2)  # 4x4 -> 2x2
        return self.fc(self.drop(torch.flatten(h, 1)))


def digits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # [1797, 1, 8, 8]
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_train = int(0.8 * len(y))
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def train(model: nn.Module, log_dir: Path, epochs: int, batch_size: int) -> tracelog.TraceLog:
    x_tr, y_tr, x_te, y_te = digits()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    # overwrite: each run of the example records into the same directory again
    with tracelog.Listener(model, log_dir, overwrite=True) as listener:
        for epoch in listener.epochs(epochs):
            model.train()
            order = torch.randperm(len(y_tr))
            for i in range(0, len(y_tr), batch_size):
                idx = order[i : i + batch_size]
                with listener.batch():
                    loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
                    loss.backward()
                opt.step()
                opt.zero_grad()
            model.eval()
            correct = 0
            with torch.no_grad():
                for i in range(0, len(y_te), batch_size):
                    with listener.batch():
                        pred = model(x_te[i : i + batch_size])
                        F.cross_entropy(pred, y_te[i : i + batch_size])
                    correct += int((pred.argmax(1) == y_te[i : i + batch_size]).sum())
            print(f"{type(model).__name__} epoch {epoch}: test accuracy {correct / len(y_te):.3f}")
    return listener.log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/digits")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--model", choices=("mlp", "cnn", "both"), default="both")
    args = parser.parse_args(argv)
    ok = True
    for name, cls in (("mlp", MLP), ("cnn", SmallCNN)):
        if args.model not in (name, "both"):
            continue
        log_dir = Path(args.out) / name
        torch.manual_seed(0)
        log = train(cls(), log_dir, args.epochs, args.batch_size)
        print(show_text(tracelog.load(log_dir), str(log_dir)))
        report = verify(log_dir, runtime="onnxruntime")
        print(report.table())
        print()
        ok = ok and report.ok and log.unrecorded == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
