"""How much one float32 accuracy ratio is one draw of rounding: a log's
program checked on its recorded sample and on draws of it nudged by one ulp
(``tracelog.check(..., draw=k)``), each output's ratio printed across draws.

    python benchmarks/draw_spread.py                      # a small PyTorch MLP, target torch
    python benchmarks/draw_spread.py LOG_DIR --target jax --draws 4

With no log, a PyTorch MLP (20-16-4 with a batch norm, batch 8) is recorded
and its PyTorch program checked: the source's own kernels, judged as a
program on another draw. Its ratios are 1.00 on the recorded draw, and on
the nudged ones they read what one draw's rounding gives against another's
(``grad 0.bias`` read 3.54, 0.50 and 2.39 on draws 1-3 when this was
written): a ratio above 2 on one output of one draw says little by itself.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import tracelog


def record_mlp(log_dir: Path) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.BatchNorm1d(16), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tracelog.Listener(model, log_dir) as listener:
        for _ in range(3):
            x, y = torch.randn(8, 20), torch.randint(0, 4, (8,))
            with listener.batch():
                F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log_dir", nargs="?", help="default: record the small MLP")
    parser.add_argument("--target", default="torch")
    parser.add_argument("--draws", type=int, default=3, help="nudged draws beside the recorded")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(args.log_dir or tmp)
        if args.log_dir is None:
            record_mlp(log_dir)
        ratios: dict[str, list[float]] = {}
        for draw in range(args.draws + 1):
            report = tracelog.check(log_dir, args.target, draw=draw)
            for c in report.comparisons:
                if c.ratio is not None and not c.name.endswith("[float64]"):
                    ratios.setdefault(c.name, []).append(c.ratio)
    width = max(len(name) for name in ratios)
    draws = "  ".join(f"{'draw ' + str(d):>7}" for d in range(args.draws + 1))
    print(f"{'output':<{width}}  {draws}  {'median':>7}")
    for name, found in ratios.items():
        cells = "  ".join(f"{r:>7.2f}" for r in found)
        print(f"{name:<{width}}  {cells}  {statistics.median(found):>7.2f}")
    per_draw = [max(found[d] for found in ratios.values()) for d in range(args.draws + 1)]
    print(f"{'largest':<{width}}  " + "  ".join(f"{r:>7.2f}" for r in per_draw))


if __name__ == "__main__":
    main()
