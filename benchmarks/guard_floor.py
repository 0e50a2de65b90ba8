"""The least a Python guarded path can cost (issue 18): the benchmark MLP's
training step with a guard that does only the work any guard needs, beside
tracelog's guarded mode, as ratios to the bare step, contexts interleaved
step by step in a fresh random order each round (as
``recording_overhead.py``).

The least guard (``LeastGuard``) reads, per batch: a tree version and the
root's training flag as the window opens; grad mode, CPU autocast and the
inputs' shapes, dtypes and devices as the forward starts; each submodule's
path from a pre hook; the loss's autograd node names (no saved values) as
backward starts; and compares the key to the last batch's. It has none of
what tracelog's key adds (every module's training flag, ``requires_grad``,
the default dtype, inference mode, CUDA autocast, the loss's saved values),
nor its bookkeeping (counts per graph pair, streaks, periodic exact
recordings, fail-open wrappers, checkpoints). It is a floor, not a design.

    python benchmarks/guard_floor.py                       # beside bare alone
    python benchmarks/guard_floor.py --contexts floor,profiler,least,tracelog

With ``--contexts floor,profiler,...`` the steps run on caches the other
contexts filled, as in ``recording_overhead.py``'s full table: every ratio
of Python work grows there.
"""

from __future__ import annotations

import argparse
import copy
import gc
import random
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import tracelog


class EmptyMode(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class LeastGuard:
    """A per-batch key with the least reading; counts the batches whose key
    repeats the last one's."""

    backward: Any = None  # torch.autograd.backward as it was, wrapped once
    # the guard the wrapper reads (one per run); every context's backward passes
    # the wrapper, as every context's passes tracelog's, at the cost of a check
    active: LeastGuard | None = None

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.version = 0
        self.calls: list[Any] = []
        self.key: Any = None
        self.repeated = 0
        self.inputs: Any = None
        self.output: Any = None
        for path, module in model.named_modules():
            if module is model:
                module.register_forward_pre_hook(self._root_starts)
                module.register_forward_hook(self._root_ends)
            else:
                module.register_forward_pre_hook(lambda m, a, p=path: self.calls.append(p))
        if LeastGuard.backward is None:
            LeastGuard.backward = torch.autograd.backward
        LeastGuard.active = self
        torch.autograd.backward = LeastGuard._traced

    @staticmethod
    def _traced(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        guard = LeastGuard.active
        if guard is not None and guard.output is not None and isinstance(tensors, torch.Tensor):
            names, todo = [], [tensors.grad_fn]
            while todo:
                node = todo.pop()
                if node is None or node is guard.output:
                    continue
                names.append(node.name())
                for fn, _ in node.next_functions:
                    todo.append(fn)
            guard.calls.append(tuple(names))
            guard.output = None
        return LeastGuard.backward(tensors, *args, **kwargs)

    def __enter__(self) -> LeastGuard:
        self.calls = []
        self.static = (self.version, self.model.training)
        return self

    def __exit__(self, *exc: Any) -> None:
        key = (self.static, self.inputs, tuple(self.calls))
        if key == self.key:
            self.repeated += 1
        self.key = key

    def _root_starts(self, module: nn.Module, args: Any) -> None:
        self.inputs = (
            torch.is_grad_enabled(),
            torch.is_autocast_enabled("cpu"),
            tuple([(a.shape, a.dtype, a.device) for a in args]),
        )

    def _root_ends(self, module: nn.Module, args: Any, output: Any) -> None:
        self.output = output.grad_fn


CONTEXTS = ("bare", "floor", "profiler", "least", "tracelog")


class Arm:
    def __init__(self, name: str, model: nn.Module, log_dir: str) -> None:
        self.name = name
        self.model = copy.deepcopy(model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.guard: Any = LeastGuard(self.model) if name == "least" else None
        if name == "tracelog":
            self.guard = tracelog.Listener(self.model, log_dir)
        self.times: list[float] = []

    def step(self, x: torch.Tensor, y: torch.Tensor, timed: bool) -> None:
        start = time.thread_time()
        if self.name == "floor":
            with EmptyMode():
                F.cross_entropy(self.model(x), y).backward()
        elif self.name == "tracelog":
            with self.guard.batch():
                F.cross_entropy(self.model(x), y).backward()
        elif self.name == "least":
            with self.guard:
                F.cross_entropy(self.model(x), y).backward()
        else:
            F.cross_entropy(self.model(x), y).backward()
        self.opt.step()
        self.opt.zero_grad()
        if timed:
            self.times.append(time.thread_time() - start)

    def block(self, x: torch.Tensor, y: torch.Tensor) -> None:
        gc.collect(1)  # each context pays for its own garbage, outside its timed step
        if self.name != "profiler":
            self.step(x, y, timed=True)
            return
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        ):
            self.step(x, y, timed=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--contexts", default="least,tracelog", help="beside bare")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cols = [c for c in args.contexts.split(",") if c]
    unknown = set(cols) - set(CONTEXTS)
    if unknown:
        parser.error(f"unknown contexts {sorted(unknown)}; known: {', '.join(CONTEXTS)}")
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)
    )
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    with tempfile.TemporaryDirectory() as d:
        arms = [Arm(c, model, f"{d}/{i}") for i, c in enumerate(["bare", *cols])]
        for arm in arms:  # warm-up: tracelog's guards trusted, the least guard's key known
            for _ in range(5):
                arm.step(x, y, timed=False)
        order = random.Random(0)
        for _ in range(args.rounds):
            for arm in order.sample(arms, len(arms)):
                arm.block(x, y)
        for arm in arms:
            if arm.name == "tracelog":
                arm.guard.close()
    bare = statistics.median(arms[0].times)
    cells = "  ".join(f"{a.name} x{statistics.median(a.times) / bare:.3f}" for a in arms[1:])
    print(f"MLP 784-128-64-10, batch 64: bare {bare * 1e3:.3f} ms  {cells}")
    least = next((a for a in arms if a.name == "least"), None)
    if least is not None:  # the least guard's key must repeat, or it measured nothing
        assert least.guard.repeated >= args.rounds, least.guard.repeated


if __name__ == "__main__":
    main()
