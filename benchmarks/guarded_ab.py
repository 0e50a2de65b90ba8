"""The guarded MLP step at two revisions side by side (issue 18): the
working tree's tracelog against another revision's, each a listener on its
own copy of the benchmark MLP, beside the bare step, contexts interleaved step
by step in a fresh random order each round, as ratios to the bare step and
the difference of their medians in microseconds.

    python benchmarks/guarded_ab.py                  # the working tree against HEAD
    python benchmarks/guarded_ab.py --against v0.3.0 --rounds 6000

The other revision's ``tracelog`` package is extracted with ``git archive``
and imported under another name in the same process, so both run on the same
caches and the same load. Both install process-wide hooks (the autograd
wrapper, optimizer step hooks) that every context's step passes, and the one
installed first sits inside the other's: so the comparison runs twice, in
two processes, each listener made first once, and prints the mean.
A difference of a few microseconds is within the spread of one run.
"""

from __future__ import annotations

import argparse
import copy
import gc
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def other_tracelog(rev: str, into: Path) -> ModuleType:
    """``rev``'s tracelog package, importable as ``tracelog_rev``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "tracelog"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    package = into / "tracelog_rev"
    (into / "tracelog").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\bfrom tracelog([. ])", r"from tracelog_rev\1", text)
        text = re.sub(r"\bimport tracelog\b", "import tracelog_rev as tracelog", text)
        path.write_text(text)
    sys.path.insert(0, str(into))
    import tracelog_rev  # type: ignore[import-not-found]

    return tracelog_rev


def run(rev: str, rounds: int, first: str) -> tuple[float, float, float]:
    """One process's comparison: (bare ms, this tree's extra us, rev's extra us)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    sys.path.insert(0, str(REPO))
    import tracelog

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)
    )
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    with tempfile.TemporaryDirectory() as d:
        rev_tracelog = other_tracelog(rev, Path(d))
        makers = {"tree": tracelog.Listener, "rev": rev_tracelog.Listener}
        arms: dict[str, Any] = {}
        for name in ["bare", first, "rev" if first == "tree" else "tree"]:
            m = copy.deepcopy(model)
            opt = torch.optim.SGD(m.parameters(), lr=1e-3)
            listener = makers[name](m, f"{d}/{name}") if name != "bare" else None
            arms[name] = (m, opt, listener, [])

        def step(arm: Any) -> None:
            m, opt, listener, times = arm
            start = time.thread_time()
            if listener is None:
                F.cross_entropy(m(x), y).backward()
            else:
                with listener.batch():
                    F.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
            times.append(time.thread_time() - start)

        names = list(arms)
        order = random.Random(0)
        for r in range(rounds):
            if r % 50 == 0:
                gc.collect(1)  # outside every timed step
            for name in order.sample(names, len(names)):
                step(arms[name])
        for name in ("tree", "rev"):
            arms[name][2].close()
            guarded = arms[name][2]._book.guarded
            assert guarded > rounds * 0.9, (name, guarded)  # it measured the guarded path
    warm = rounds // 10
    med = {n: statistics.median(a[3][warm:]) for n, a in arms.items()}
    return med["bare"] * 1e3, (med["tree"] - med["bare"]) * 1e6, (med["rev"] - med["bare"]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="HEAD", help="the other revision (default HEAD)")
    parser.add_argument("--rounds", type=int, default=4000)
    parser.add_argument("--first", choices=("tree", "rev"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first:  # one process's run, printed for the parent
        print(*run(args.against, args.rounds, args.first))
        return
    diffs = []
    for first in ("tree", "rev"):
        out = subprocess.run(
            [sys.executable, __file__, "--against", args.against, "--rounds", str(args.rounds)]
            + ["--first", first],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        bare, tree, rev = map(float, out[-3:])
        diffs.append(tree - rev)
        print(
            f"{first} made first: bare {bare:.3f} ms  working tree x{1 + tree / bare / 1e3:.3f} "
            f"(+{tree:.1f} us)  {args.against} x{1 + rev / bare / 1e3:.3f} (+{rev:.1f} us)"
        )
    print(f"working tree - {args.against}: {statistics.mean(diffs):+.1f} us a step (mean of 2)")


if __name__ == "__main__":
    main()
