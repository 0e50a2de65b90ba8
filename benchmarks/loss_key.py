"""The guarded fast path's loss key, two ways, side by side in one run: read
from the autograd graph as backward starts (what a training window does),
or noted call by call by a TorchFunctionMode (what it did before, and still
does without grad). Three copies of an MLP take turns in blocks of steps:
bare, tracelog reading the graph, tracelog with the mode; each step is
forward, loss, backward and SGD step. Prints the median CPU time per step,
each listener's cost over the bare step and what the mode costs more, for a
cross-entropy loss and a loss written with eight function calls. (Both
listeners' global hooks, on optimizer steps and module registrations, run
for every model here: the costs over bare are each a little high, the
difference between them is the loss key's.)

    python benchmarks/loss_key.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import tracelog
from tracelog.adapters.torch import listener as torch_listener


def _loss(kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y)

    def written(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logp = F.log_softmax(out, -1)
        penalty = out.pow(2).mean() * 1e-3
        return 0.9 * F.nll_loss(logp, y) - 0.1 * logp.mean() + penalty.clamp(max=1.0)

    return cross_entropy if kind == "cross_entropy" else written


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)
    )


def compare(kind: str, rounds: int = 25, steps: int = 200) -> dict[str, float]:
    loss_of = _loss(kind)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    models = {name: _mlp() for name in ("bare", "graph", "mode")}
    opts = {n: torch.optim.SGD(m.parameters(), lr=0.01) for n, m in models.items()}
    listeners = {
        n: tracelog.Listener(models[n], tempfile.mkdtemp() + "/log") for n in ("graph", "mode")
    }
    grad_fns = torch_listener._grad_fns

    def step(name: str) -> None:
        model, opt = models[name], opts[name]
        if name == "bare":
            loss_of(model(x), y).backward()
        else:
            # no output grad_fns: the key notes the loss's calls with its mode
            torch_listener._grad_fns = grad_fns if name == "graph" else lambda output: ()
            with listeners[name].batch():
                loss_of(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    times: dict[str, list[float]] = {name: [] for name in models}
    try:
        for name in models:  # warm-up: the listeners' exact recordings, then trusted keys
            for _ in range(10):
                step(name)
        for _ in range(rounds):
            for name in models:
                start = time.process_time()
                for _ in range(steps):
                    step(name)
                times[name].append((time.process_time() - start) / steps * 1e6)
    finally:
        torch_listener._grad_fns = grad_fns
        for listener in listeners.values():
            listener.close()
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    torch.set_num_threads(1)
    print("median CPU time per step (us); cost over the bare step")
    for kind in ("cross_entropy", "written"):
        t = compare(kind)
        graph, mode = t["graph"] - t["bare"], t["mode"] - t["bare"]
        print(
            f"{kind:<14} bare {t['bare']:7.1f}  loss read from the graph +{graph:5.1f}"
            f"  loss noted by a TorchFunctionMode +{mode:5.1f}  (the mode: {mode - graph:+.1f} us)"
        )


if __name__ == "__main__":
    main()
