"""The main job: train an MLP on scikit-learn's digits for 3 epochs with a
tracelog listener, emit the run as a TensorFlow program, and check parity:
predictions, loss and every parameter gradient, TensorFlow against PyTorch.

    python examples/digits_mlp_torch_to_tf.py --out runs/digits_mlp
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import tracelog
from tracelog.cli import show_text


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


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # [1797, 1, 8, 8]
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    n_train = int(0.8 * len(y))
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def record(log_dir: Path, epochs: int = 3, batch_size: int = 64) -> tracelog.TraceLog:
    torch.manual_seed(0)
    model = MLP()
    x_tr, y_tr, x_te, y_te = digits()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    # overwrite: each run of the example records into the same directory again
    with tracelog.Listener(model, log_dir, overwrite=True) as listener:
        for epoch in listener.epochs(epochs):
            model.train()
            for i in range(0, len(y_tr), batch_size):
                with listener.batch():
                    loss = F.cross_entropy(
                        model(x_tr[i : i + batch_size]), y_tr[i : i + batch_size]
                    )
                    loss.backward()
                opt.step()
                opt.zero_grad()
            model.eval()
            with torch.no_grad(), listener.batch():
                pred = model(x_te)
                F.cross_entropy(pred, y_te)
            accuracy = float((pred.argmax(1) == y_te).float().mean())
            print(f"epoch {epoch}: train loss {loss.item():.3f}, test accuracy {accuracy:.3f}")
    return listener.log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/digits_mlp")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    log_dir = Path(args.out)
    record(log_dir, args.epochs)
    print(show_text(tracelog.load(log_dir), str(log_dir)))
    program = tracelog.emit(log_dir, target="tensorflow")
    print(f"\nwrote {program}; running it as a plain script:\n")
    # The program stands alone: TensorFlow, NumPy and safetensors, no tracelog.
    run = subprocess.run([sys.executable, str(program)], capture_output=True, text=True)
    print(run.stdout)
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
