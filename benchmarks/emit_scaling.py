"""Emission and checking against graph size: a GPT-2 of 4, 16 and 48 layers
(tiny width, one recorded training batch), each log emitted for every target
and checked on one; prints the time per graph node and the marginal time per
node from one size to the next, so that a pass quadratic in the graph shows
as a marginal cost growing with depth (linear: flat).

    python benchmarks/emit_scaling.py [--layers 4 16 48] [--targets tensorflow jax onnx]
        [--check tensorflow] [--repeats 3]

Each timing is the best of --repeats runs in a fresh emission (no caches
shared between models: each program's text is formatted anew), so machine
noise inflates no ratio more than the others.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

import tracelog
import tracelog.emit.program as program
from tracelog.parity import check


def record(n_layer: int, root: Path) -> tuple[Path, int]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=n_layer, n_head=2)
    model = GPT2LMHeadModel(cfg)
    model.config.use_cache = False
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ids = torch.randint(0, 64, (2, 8))
    log_dir = root / f"gpt2_{n_layer}"
    with tracelog.Listener(model, log_dir) as listener:
        with listener.batch():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
    log = tracelog.load(log_dir)
    return log_dir, sum(len(g.nodes) for g in log.graphs.values())


def best_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        program._formatted.cache_clear()  # each emission formats its text anew
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 16, 48])
    ap.add_argument("--targets", nargs="+", default=["tensorflow", "jax", "onnx"])
    ap.add_argument("--check", nargs="*", default=["tensorflow"], help="targets to check")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="emit_scaling_"))
    logs = {n: record(n, root) for n in args.layers}
    rows: list[tuple[str, int, int, float]] = []
    for target in args.check:  # imports and first-call costs, outside the timings
        check(logs[min(args.layers)][0], target)
    for n, (log_dir, nodes) in logs.items():
        for target in args.targets:
            out = str(root / f"out_{n}_{target}")
            t = best_time(partial(tracelog.emit, log_dir, target, out), args.repeats)
            rows.append((f"emit {target}", n, nodes, t))
        for target in args.check:
            t = best_time(partial(check, log_dir, target), 1)
            rows.append((f"check {target}", n, nodes, t))
    # the marginal time per node between one size and the next leaves out what
    # every program costs alike (the inlined runtime): flat when linear
    print(f"{'what':<18} {'layers':>6} {'nodes':>6} {'seconds':>8} {'ms/node':>8} {'marginal':>8}")
    last: dict[str, tuple[int, float]] = {}
    first_marginal: dict[str, float] = {}
    ratios: list[float] = []
    for what, n, nodes, t in rows:
        marginal = ""
        if what in last:
            m = (t - last[what][1]) / (nodes - last[what][0])
            first_marginal.setdefault(what, m)
            ratios.append(m / first_marginal[what])
            marginal = f"{1000 * m:>8.2f}"
        last[what] = (nodes, t)
        print(f"{what:<18} {n:>6} {nodes:>6} {t:>8.2f} {1000 * t / nodes:>8.2f} {marginal:>8}")
    if len(args.layers) > 2:
        print(f"marginal ms/node, largest step over smallest step: worst {max(ratios):.2f}")


if __name__ == "__main__":
    main()
