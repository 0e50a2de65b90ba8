"""Compiled training with and without a tracelog listener, side by side in one
run: two copies of one model, both under ``torch.compile`` (Inductor unless
``--backend``), one of them inside ``listener.batch()`` windows; their steps
interleaved (one step each, in turn) so that machine noise hits both alike.
Prints the time per step of each, their ratio, and Dynamo's counters (frames
compiled, recompilations, graph breaks) to show the listener's copy compiles
once and runs compiled, as the plain copy does.

Two ways a user attaches: ``--attach before`` (the listener attached to the
model, then ``torch.compile``: its first compiled call is inside a window,
which used to disable compilation for the rest of training) and
``--attach after`` (the listener attached to the compiled module: one
warning, nothing added to the model).

    python benchmarks/compile_overhead.py [--steps 200] [--attach before|after] [--backend inductor]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import tracelog


class Block(nn.Module):
    """Element-wise work that Inductor fuses (eager runs each op on its own)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.norm(x))
        return x + F.gelu(h) * torch.sigmoid(h) + torch.tanh(h) * 0.1


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), *[Block(128) for _ in range(4)], nn.Linear(128, 10))


def make_step(
    model: Any, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, listener: Any
) -> Callable[[], float]:
    def step() -> float:
        start = time.perf_counter()
        if listener is None:
            F.cross_entropy(model(x), y).backward()
        else:
            with listener.batch():
                F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - start

    return step


def dynamo_counts() -> dict[str, int]:
    c = torch._dynamo.utils.counters
    return {
        "frames compiled": int(c["frames"]["ok"]),
        "recompiles": int(sum(c["recompiles"].values())),
        "graph breaks": int(sum(c["graph_break"].values())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--attach", choices=("before", "after"), default="before")
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared 2-core machine: keep the two arms comparable
    x, y = torch.randn(512, 64), torch.randint(0, 10, (512,))

    plain_net = mlp()
    plain = torch.compile(plain_net, backend=args.backend)
    plain_step = make_step(plain, torch.optim.SGD(plain_net.parameters(), lr=0.01), x, y, None)
    for _ in range(args.warmup):
        plain_step()
    before = dynamo_counts()
    print(f"plain copy compiled: {before}")

    net = mlp()
    with tempfile.TemporaryDirectory() as d:
        if args.attach == "before":
            listener = tracelog.Listener(net, d)
            model = torch.compile(net, backend=args.backend)
        else:
            model = torch.compile(net, backend=args.backend)
            listener = tracelog.Listener(model, d)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        traced_step = make_step(model, opt, x, y, listener)
        for _ in range(args.warmup):  # the first compiled call is inside a window
            traced_step()
        warm = dynamo_counts()
        print(f"listener copy compiled: {warm}")
        plain_t, traced_t = [], []
        for _ in range(args.steps):
            plain_t.append(plain_step())
            traced_t.append(traced_step())
        listener.close()
        after = dynamo_counts()
        log = tracelog.load(d)
    grew = {k: after[k] - warm[k] for k in after}
    print(f"during the timed steps (both copies): {grew}")
    p, t = statistics.median(plain_t), statistics.median(traced_t)
    print(
        f"attach {args.attach}, backend {args.backend}, {args.steps} interleaved steps: "
        f"plain {p * 1e3:.3f} ms/step, with listener {t * 1e3:.3f} ms/step, ratio {t / p:.3f}"
    )
    print(
        f"log: {log.recorded} recorded, {log.unrecorded} unrecorded, "
        f"{log.optimizer_steps} optimizer steps; first reason: "
        f"{log.failures[0]['error'] if log.failures else '-'}"
    )
    # eager, for scale: the same model without torch.compile
    eager_net = mlp()
    eager_step = make_step(eager_net, torch.optim.SGD(eager_net.parameters(), lr=0.01), x, y, None)
    eager = statistics.median(eager_step() for _ in range(args.steps))
    print(f"for scale: eager {eager * 1e3:.3f} ms/step")


if __name__ == "__main__":
    main()
