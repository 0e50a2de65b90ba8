"""How much of a float32 accuracy ratio is one draw of rounding: Keras models
of the models matrix recorded twice on the same batch and weights, with
TensorFlow's oneDNN kernels (its default on x86) and with its Eigen kernels
(TF_ENABLE_ONEDNN_OPTS=0), and each run's float32 outputs judged as a
program's are, against the other run's sample (the same float64 reference,
the other run's own float32 error as the unit): the source against itself.
With --targets, each target's program is checked against both recordings.

    python benchmarks/source_draws.py mobilenet_v2 resnet50
    python benchmarks/source_draws.py mobilenet_v2 --targets torch onnx

A ratio above 2 here is TensorFlow's own, with another set of its kernels.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

KERNELS = {"oneDNN": "1", "Eigen": "0"}  # TF_ENABLE_ONEDNN_OPTS


def record(models: list[str], root: Path) -> None:
    """Each model's log under root/<kernels>/<model>, one process per kernel
    set (TensorFlow reads TF_ENABLE_ONEDNN_OPTS when it starts)."""
    for kernels, flag in KERNELS.items():
        env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": flag}
        out = root / kernels
        cmd = [sys.executable, __file__, "--record", str(out), *models]
        subprocess.run(cmd, env=env, check=True)


def judged(source: Path, other: Path) -> tuple[list[tuple[float, str]], bool]:
    """Every float output of other's sample judged against source's sample:
    (ratio, key) worst first, and whether both hold the same reference."""
    import tracelog
    from tracelog.sample import reference_key
    from tracelog.verify import SampleJudge

    a, b = tracelog.load(source).sample(), tracelog.load(other).sample()
    refs = [k for k in a if k.startswith(reference_key(""))]
    same = all(k in b and np.array_equal(a[k], b[k]) for k in refs)
    judge = SampleJudge(a)
    rows = []
    for key in a:
        if reference_key(key) in a and key in b and not key.startswith(reference_key("")):
            row = judge.checked(key, b[key], key, 0.0, 0.0)
            if row.ratio is not None:
                rows.append((row.ratio, key))
    return sorted(rows, reverse=True), same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="Keras models of the matrix (mobilenet_v2 ...)")
    parser.add_argument("--targets", nargs="+", default=[], choices=("torch", "jax", "onnx"))
    parser.add_argument("--keep", metavar="DIR", help="write the logs here instead of a temp dir")
    parser.add_argument("--record", metavar="DIR", help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args(argv)
    logging.getLogger("tracelog").setLevel(logging.ERROR)
    import real_models_keras as side

    unknown = [m for m in args.models if m not in side.BY_NAME]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {sorted(side.BY_NAME)}")
    if args.record:
        for m in args.models:
            side.train(side.BY_NAME[m], Path(args.record) / m)
        return 0
    import tracelog

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        record(args.models, root)
        for m in args.models:
            one, two = (root / kernels / m for kernels in KERNELS)
            for (name_a, a), (name_b, b) in (
                (("oneDNN", one), ("Eigen", two)),
                (("Eigen", two), ("oneDNN", one)),
            ):
                rows, same = judged(a, b)
                if not same:
                    print(f"{m:<16} the two runs' float64 references differ: not comparable")
                    break
                print(
                    f"{m:<16} TF {name_b} judged against TF {name_a}: {len(rows)} rows, "
                    f"ratio at most {rows[0][0]:.2f} ({rows[0][1]}), "
                    f"median {np.median([r for r, _ in rows]):.2f}, "
                    f"{sum(r > 2 for r, _ in rows)} above 2"
                )
            for target in args.targets:
                for kernels in KERNELS:
                    log_dir = root / kernels / m
                    tracelog.emit(log_dir, target=target)
                    report = tracelog.check(log_dir, target)
                    ratios = [
                        (c.ratio, c.name)
                        for c in report.comparisons
                        if c.ratio is not None and not c.name.endswith("[float64]")
                    ]
                    worst = max(ratios)
                    print(
                        f"{m:<16} {target} program against TF {kernels}: ratio at most "
                        f"{worst[0]:.2f} ({worst[1]}), {sum(r > 2 for r, _ in ratios)} above 2"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
