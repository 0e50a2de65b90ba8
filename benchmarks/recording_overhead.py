"""Recording overhead (issue 18), as ratios to a bare training step, every
context measured in one run with the contexts interleaved: each round runs a
few steps of each context in turn, so that machine noise hits all alike.

Contexts: ``floor`` (an empty TorchDispatchMode around the step: the least
any dispatch-level recorder costs), ``profiler`` (torch.profiler with
``record_shapes=True``; its start and stop are outside the timed steps),
``tracelog`` (the default, guarded mode) and ``tracelog exact``
(``mode="exact"``: every batch recorded op by op). Each context trains its
own copy of the model (hooks of one listener never slow another context);
each round runs the contexts in a fresh random order.
The median ratio is the issue's measure; the mean ratio also carries the
guarded mode's periodic exact re-recordings (every ``--rerecord-every``).

    python benchmarks/recording_overhead.py [--rounds 120] [--steps 1] [--models mlp,cnn,gpt2]
    python benchmarks/recording_overhead.py --clock cpu   # the thread's CPU time, not wall
    python benchmarks/recording_overhead.py --gc   # + each context's share of time in gc
    python benchmarks/recording_overhead.py --models mlp --export   # + record+emit vs export
    python benchmarks/recording_overhead.py --models keras_tape,keras_fit_eager,keras_fit

The Keras rows (a small CNN: a GradientTape loop, ``fit(run_eagerly=True)``,
traced ``fit``) live in ``recording_overhead_keras.py``.

(torch.profiler's C++ side prints two lines per session on stderr:
``2>/dev/null`` keeps the table alone.)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import tracelog


class EmptyMode(TorchDispatchMode):
    """The floor: a dispatch mode that only runs each op."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(h)))


class ResCNN(nn.Module):
    """4 residual blocks of 32 channels on 3x16x16 images."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.blocks = nn.Sequential(*[Block(32) for _ in range(4)])
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(F.relu(self.stem(x)))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def _mlp() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    model = nn.Sequential(
        nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)
    )
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    return model, lambda m: F.cross_entropy(m(x), y)


def _cnn() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))
    return ResCNN(), lambda m: F.cross_entropy(m(x), y)


def _gpt2() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=4,
        n_embd=128,
        n_head=4,
        n_positions=64,
        vocab_size=2048,
        attn_implementation="eager",
    )
    ids = torch.randint(0, 2048, (8, 64))
    return GPT2LMHeadModel(config), lambda m: m(input_ids=ids, labels=ids).loss


MODELS = {
    "mlp": ("MLP 784-128-64-10, batch 64", _mlp),
    "cnn": ("CNN 4 residual blocks, batch 32", _cnn),
    "gpt2": ("GPT-2 4x128, batch 8x64", _gpt2),
}
CONTEXTS = ("bare", "floor", "profiler", "tracelog", "tracelog exact")
# wall time, or the main thread's CPU time (--clock cpu): on a shared machine the
# other processes' load moves wall times; with one torch thread the step runs on
# this thread, so its CPU time is the step's cost without the time it waited
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = CLOCKS["wall"]


# each context's share of its timed steps spent in the garbage collector (the last
# model measure() ran; printed with --gc)
GC_SHARE: dict[str, float] = {}


class GcTime:
    """Seconds Python's garbage collector ran, summed (a gc callback)."""

    total = 0.0
    _start = 0.0

    @classmethod
    def install(cls) -> None:
        gc.callbacks.append(cls._callback)

    @classmethod
    def _callback(cls, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            cls._start = time.perf_counter()
        else:
            cls.total += time.perf_counter() - cls._start


class Arm:
    """One context: its own model copy, optimizer and (for tracelog) listener."""

    def __init__(self, name: str, model: nn.Module, log_dir: str, rerecord_every: int) -> None:
        self.name = name
        self.model = copy.deepcopy(model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.listener: Any = None
        if name.startswith("tracelog"):
            mode = "exact" if name.endswith("exact") else "guarded"
            self.listener = tracelog.Listener(
                self.model, log_dir, mode=mode, rerecord_every=rerecord_every
            )
        self.times: list[float] = []
        self.gc = 0.0  # of the timed steps, seconds in the garbage collector

    @contextlib.contextmanager
    def block(self) -> Iterator[None]:
        """Around a block of steps: only the profiler has a session to open.
        The young garbage of the contexts before is collected first, outside
        the timed steps: each context pays for the collections of its own
        garbage, not another's (the profiler's session leaves a lot)."""
        gc.collect(1)
        if self.name != "profiler":
            yield
            return
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        ):
            yield

    def step(self, loss_of: Callable[[nn.Module], torch.Tensor], timed: bool) -> None:
        gc_before = GcTime.total
        start = clock()
        if self.name == "floor":
            with EmptyMode():
                loss_of(self.model).backward()
        elif self.listener is not None:
            with self.listener.batch():
                loss_of(self.model).backward()
        else:
            loss_of(self.model).backward()
        self.opt.step()
        self.opt.zero_grad()
        if timed:
            self.times.append(clock() - start)
            self.gc += GcTime.total - gc_before


def measure(
    make: Any, contexts: list[str], rounds: int, steps: int, rerecord_every: int
) -> dict[str, list[float]]:
    torch.manual_seed(0)
    model, loss_of = make()
    with tempfile.TemporaryDirectory() as d:
        arms = [Arm(c, model, f"{d}/{i}", rerecord_every) for i, c in enumerate(contexts)]
        for arm in arms:  # warm-up: graphs built, the sample taken, guards trusted
            with arm.block():
                for _ in range(5):
                    arm.step(loss_of, timed=False)
        shuffle = random.Random(0)
        for _ in range(rounds):
            # a fresh order each round: no context always runs right after the
            # profiler's session or an exact recording (cold caches)
            order = shuffle.sample(arms, len(arms))
            for arm in order:
                with arm.block():
                    for _ in range(steps):
                        arm.step(loss_of, timed=True)
        for arm in arms:
            if arm.listener is not None:
                arm.listener.close()
        for arm in arms:
            GC_SHARE[arm.name] = arm.gc / max(sum(arm.times), 1e-12)
        return {arm.name: arm.times for arm in arms}


def export_against_record(make: Any) -> tuple[float, float, float, float]:
    """Seconds to record one batch exactly (listener made, batch, close) and
    to emit the PyTorch program, against ``torch.export.export`` capturing the
    model's forward and loss, and the same batch's forward and backward with
    no listener (what training runs anyway); the second of two runs each
    (imports warm)."""
    model, loss_of = make()

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self) -> torch.Tensor:
            return loss_of(self.model)

    timed: list[tuple[float, float, float, float]] = []
    for _ in range(2):
        gc.collect()
        before_bare = time.perf_counter()
        loss_of(model).backward()
        bare = time.perf_counter() - before_bare
        model.zero_grad()
        with tempfile.TemporaryDirectory() as d:
            gc.collect()  # before each phase, untimed: none pays for the garbage before it
            start = time.perf_counter()
            with tracelog.Listener(model, d) as listener, listener.batch():
                loss_of(model).backward()
            recorded = time.perf_counter()
            gc.collect()
            before_emit = time.perf_counter()
            tracelog.emit(d, target="torch")
            emitted = time.perf_counter()
        gc.collect()
        before_export = time.perf_counter()
        torch.export.export(Loss(), ())
        exported = time.perf_counter()
        timed.append((recorded - start, emitted - before_emit, exported - before_export, bare))
    return timed[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--steps", type=int, default=1, help="steps per context per round")
    parser.add_argument("--models", default="mlp,cnn,gpt2")
    parser.add_argument("--rerecord-every", type=int, default=100)
    parser.add_argument("--contexts", default=",".join(CONTEXTS[1:]), help="beside bare")
    parser.add_argument(
        "--export", action="store_true", help="also: record+emit against torch.export (GPT-2)"
    )
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument(
        "--gc", action="store_true", help="also: each context's share of time in Python's gc"
    )
    args = parser.parse_args()
    if args.gc:
        GcTime.install()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(1)  # a shared machine: keep the contexts comparable
    cols = [c for c in args.contexts.split(",") if c]
    unknown = set(cols) - set(CONTEXTS)
    if unknown:
        parser.error(f"unknown contexts {sorted(unknown)}; known: {', '.join(CONTEXTS)}")
    print(
        f"median step time ratio to bare (mean ratio in brackets); {torch.__version__}, "
        f"1 thread, {args.clock} clock"
    )
    print(f"{'model':<34} {'bare ms':>8} " + " ".join(f"{c:>18}" for c in cols))
    keras_rows: Any = None
    for key in args.models.split(","):
        if key.startswith("keras"):
            if keras_rows is None:
                import recording_overhead_keras as keras_rows  # beside this file

                keras_rows.one_thread()
            label, times = keras_rows.measure(
                key, ["bare", *cols], args.rounds, args.steps, args.rerecord_every
            )
        else:
            label, make = MODELS[key]
            times = measure(make, ["bare", *cols], args.rounds, args.steps, args.rerecord_every)
        bare_med, bare_mean = statistics.median(times["bare"]), statistics.mean(times["bare"])
        cells = []
        for c in cols:
            med = statistics.median(times[c]) / bare_med
            mean = statistics.mean(times[c]) / bare_mean
            cells.append(f"{f'x{med:.2f} (x{mean:.2f})':>18}")
        print(f"{label:<34} {bare_med * 1e3:>8.2f} " + " ".join(cells), flush=True)
        if args.gc and not key.startswith("keras"):
            shares = " ".join(f"{f'{GC_SHARE[c]:.1%}':>18}" for c in cols)
            bare_share = f"{GC_SHARE['bare']:.1%}"
            print(f"{'  of which in gc':<34} {bare_share:>8} " + shares)
    if args.export:
        record, emit, export, bare = export_against_record(_gpt2)
        print(
            f"GPT-2 4x128: record one batch {record:.2f} s + emit (torch) {emit:.2f} s = "
            f"{record + emit:.2f} s; torch.export capture {export:.2f} s "
            f"(x{(record + emit) / export:.2f}); less the batch's own forward and "
            f"backward ({bare:.2f} s): x{(record - bare + emit) / export:.2f}"
        )


if __name__ == "__main__":
    main()
