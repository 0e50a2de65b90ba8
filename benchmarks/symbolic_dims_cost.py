"""What finding sequence symbols costs: the time of a batch that builds its
graphs (an unseen fingerprint: the only batches that replay the tape), with
and without the symbol search, side by side in one run (median of 3).

    python benchmarks/symbolic_dims_cost.py [model ...]   # tests/real_models.py names

Batches whose fingerprint was seen before build nothing and pay nothing.
"""

from __future__ import annotations

import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import real_models
import torch

import tracelog.adapters.symbols as symbols
from tracelog.adapters.torch import TorchListener

SEARCH = symbols.candidates


def first_batch_seconds(name: str, search: bool, log_dir: Path) -> float:
    symbols.candidates = SEARCH if search else (lambda tape: [])
    try:
        case = real_models.BY_NAME[name]
        torch.manual_seed(0)
        model = case.build()
        batch = case.batch(torch.Generator().manual_seed(0), 0)
        listener = TorchListener(model, log_dir, overwrite=True)
        t0 = time.perf_counter()
        with listener.batch():
            case.step(model, batch).backward()
        seconds = time.perf_counter() - t0
        listener.close()
        return seconds
    finally:
        symbols.candidates = SEARCH


def main(names: list[str]) -> None:
    logging.getLogger("tracelog").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            runs = [
                (
                    first_batch_seconds(name, False, Path(tmp)),
                    first_batch_seconds(name, True, Path(tmp)),
                )
                for _ in range(3)
            ]
            without = statistics.median(r[0] for r in runs)
            with_search = statistics.median(r[1] for r in runs)
            print(
                f"{name:20s} first batch: {without * 1000:6.0f} ms without the symbol search, "
                f"{with_search * 1000:6.0f} ms with it (x{with_search / without:.2f})"
            )


if __name__ == "__main__":
    main(sys.argv[1:] or ["gpt2", "t5", "transformer_encoder", "gru_tagger"])
