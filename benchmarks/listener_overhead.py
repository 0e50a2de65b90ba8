"""Listener overhead, measured side by side in one run: the same training
batches with and without a tracelog listener, interleaved so that machine
noise hits both alike. Prints the time per batch of each and their ratio.

    python benchmarks/listener_overhead.py [--batches 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import tracelog


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)
    )


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.25),
        nn.Linear(32 * 2 * 2, 10),
    )


def run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batches: int, listener) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.perf_counter()
    for _ in range(batches):
        if listener is None:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        else:
            with listener.batch():
                loss = F.cross_entropy(model(x), y)
                loss.backward()
        opt.step()
        opt.zero_grad()
    return (time.perf_counter() - start) / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared 2-core machine: keep the two arms comparable
    shapes = {"mlp": (mlp, (64, 1, 8, 8)), "cnn": (cnn, (64, 1, 8, 8))}
    print(f"{'model':<6} {'plain ms/batch':>15} {'listener ms/batch':>18} {'ratio':>7}")
    for name, (make, shape) in shapes.items():
        torch.manual_seed(0)
        model = make()
        x, y = torch.randn(*shape), torch.randint(0, 10, (shape[0],))
        if name == "mlp":
            x = x.flatten(1)
        with tempfile.TemporaryDirectory() as d:
            listener = tracelog.Listener(model, d)
            run(model, x, y, 5, listener)  # warm-up: the graphs are built here
            plain, traced = [], []
            for _ in range(args.rounds):
                plain.append(run(model, x, y, args.batches, None))
                traced.append(run(model, x, y, args.batches, listener))
            listener.close()
        p, t = statistics.median(plain), statistics.median(traced)
        print(f"{name:<6} {p * 1e3:>15.3f} {t * 1e3:>18.3f} {t / p:>7.2f}")


if __name__ == "__main__":
    main()
