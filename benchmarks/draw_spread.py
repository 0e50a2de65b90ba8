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

``--control TARGET`` checks the log's program for TARGET too (for a Keras log,
``tensorflow``: the source's own kernels), on the same draws, and prints
beside each draw's largest ratio the control's, then per group of outputs
(its kind, layer type and parameter: ``grad bn/gamma``, ``grad dwconv/kernel``,
``update bn/moving_mean``) the geometric mean of the program's error over the
control's. A spelling numerically worse than the source's kernel reads as a
group consistently above 1 on the nudged draws; noise as groups near 1 and
the two largest ratios alike. (On the recorded draw the control computes what
the source did with its kernels, not bit for bit: its ratios there read about
1, at most 1.07 on EfficientNetB0.) When this was written, EfficientNetB0's
PyTorch program read largest 2.05, 1.80, 2.11 on draws 0-2 and its TensorFlow
program 1.07, 1.80, 2.15; the geometric mean of error over the TensorFlow
program's of every group of 16 or more outputs was 0.78-1.04 on draws 1 and 2
(DenseNet121's JAX program: 2.03, 1.46, 1.32, 1.31, 1.26 against 1.01, 1.52,
1.67, 1.82, 1.40; groups 0.71-0.96 on the nudged draws).

    python benchmarks/draw_spread.py LOG_DIR --target torch --control tensorflow
"""

from __future__ import annotations

import argparse
import math
import re
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


def group(name: str) -> str:
    """An output's group: its kind (grad, update, or the output itself), the
    type of its layer (the layer name's last word, digits dropped) and the
    parameter: ``grad block6c_dwconv/kernel`` -> ``grad dwconv/kernel``,
    ``update:conv5_block12_1_bn/moving_mean`` -> ``update bn/moving_mean``,
    ``grad 0.bias`` -> ``grad /bias``."""
    kind, _, path = name.replace("update:", "update ", 1).partition(" ")
    if not path:
        return name
    layer, _, leaf = path.replace(".", "/").rpartition("/")
    word = re.sub(r"\d+", "", re.split(r"[_/]", layer)[-1]) if layer else ""
    return f"{kind} {word}/{leaf}"


def errors(
    log_dir: Path, target: str, draws: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per output (float32 rows against the float64 reference): its ratio and
    its error on each draw, the recorded one first."""
    ratios: dict[str, list[float]] = {}
    errs: dict[str, list[float]] = {}
    for draw in range(draws + 1):
        report = tracelog.check(log_dir, target, draw=draw)
        for c in report.comparisons:
            if c.ratio is not None and not c.name.endswith("[float64]"):
                ratios.setdefault(c.name, []).append(c.ratio)
                errs.setdefault(c.name, []).append(c.max_abs)
    return ratios, errs


def print_control(
    ratios: dict[str, list[float]],
    errs: dict[str, list[float]],
    control: str,
    found: tuple[dict[str, list[float]], dict[str, list[float]]],
    draws: int,
) -> None:
    """The control's largest ratio per draw, then per group the geometric mean
    of the program's error over the control's on each draw."""
    control_ratios, control_errs = found
    per_draw = [max(r[d] for r in control_ratios.values()) for d in range(draws + 1)]
    print(f"largest ratio of the {control} program: " + "  ".join(f"{r:.2f}" for r in per_draw))
    logs: dict[str, list[list[float]]] = {}
    for name, mine in errs.items():
        theirs = control_errs.get(name)
        if theirs is None:
            continue
        row = logs.setdefault(group(name), [[] for _ in range(draws + 1)])
        for d in range(draws + 1):
            if mine[d] > 0 and theirs[d] > 0:
                row[d].append(math.log(mine[d] / theirs[d]))
    width = max(len(g) for g in logs)
    cells = "  ".join(f"{'draw ' + str(d):>7}" for d in range(draws + 1))
    print(f"\nerror over the {control} program's, geometric mean per group:")
    print(f"{'group':<{width}}  {'n':>4}  {cells}")
    for name, row in sorted(logs.items()):
        means = "  ".join(f"{math.exp(statistics.mean(v)) if v else math.nan:>7.2f}" for v in row)
        print(f"{name:<{width}}  {len(row[0]):>4}  {means}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log_dir", nargs="?", help="default: record the small MLP")
    parser.add_argument("--target", default="torch")
    parser.add_argument("--draws", type=int, default=3, help="nudged draws beside the recorded")
    parser.add_argument(
        "--control", help="also check this target's program (tensorflow for a Keras log)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(args.log_dir or tmp)
        if args.log_dir is None:
            record_mlp(log_dir)
        ratios, errs = errors(log_dir, args.target, args.draws)
        control = errors(log_dir, args.control, args.draws) if args.control else None
    width = max(len(name) for name in ratios)
    draws = "  ".join(f"{'draw ' + str(d):>7}" for d in range(args.draws + 1))
    print(f"{'output':<{width}}  {draws}  {'median':>7}")
    for name, found in ratios.items():
        cells = "  ".join(f"{r:>7.2f}" for r in found)
        print(f"{name:<{width}}  {cells}  {statistics.median(found):>7.2f}")
    per_draw = [max(found[d] for found in ratios.values()) for d in range(args.draws + 1)]
    print(f"{'largest':<{width}}  " + "  ".join(f"{r:>7.2f}" for r in per_draw))
    if control is not None:
        print_control(ratios, errs, args.control, control, args.draws)


if __name__ == "__main__":
    main()
