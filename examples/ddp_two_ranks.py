"""DistributedDataParallel on two CPU processes (gloo), recorded by rank 0.

Run by torchrun (each rank runs this file; rank 0 writes the log, the other
ranks record nothing), then the log is shown and checked:

    torchrun --nproc_per_node 2 examples/ddp_two_ranks.py --out runs/ddp
    tracelog show runs/ddp
    tracelog check runs/ddp --target tensorflow

Each rank trains on its own shard of the data; DDP averages the gradients
across ranks in the backward. The counts are rank 0's forward passes (never
one per rank), the optimizer steps the global steps, ``trace.json`` says the
world size, and the sample's gradients are rank 0's own micro-batch's (taken
before DDP's all-reduce), so ``tracelog check`` compares like with like.
``--ranks all`` records every rank, each into ``OUT/rank<N>``.
``--find-unused-parameters`` (with a layer the forward never calls) and
``--static-graph`` pass DDP's options of those names.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import tracelog

FEATURES, CLASSES = 16, 4


class Net(nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 32)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(32, CLASSES)
        if unused:  # parameters no forward reaches: what find_unused_parameters is for
            self.spare = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def train(
    out: Path,
    *,
    steps: int = 3,
    accumulate: int = 1,
    ranks: str = "0",
    find_unused_parameters: bool = False,
    static_graph: bool = False,
) -> None:
    """``steps`` optimizer steps of ``accumulate`` micro-batches of 8 rows per
    rank (the last micro-batch of a step all-reduces, the others run under
    ``no_sync``), then one eval batch."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts them too)
    model = DDP(
        Net(unused=find_unused_parameters),
        find_unused_parameters=find_unused_parameters,
        static_graph=static_graph,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    data = [
        (torch.randn(8, FEATURES, generator=g), torch.randint(0, CLASSES, (8,), generator=g))
        for _ in range(steps * accumulate)
    ]
    which: str | list[int] = "all" if ranks == "all" else [int(r) for r in ranks.split(",")]
    if isinstance(which, list) and len(which) == 1:
        which = which[0]  # type: ignore[assignment]
    with tracelog.Listener(model, out, overwrite=True, ranks=which) as listener:
        for step in range(steps):
            micro = data[step * accumulate : (step + 1) * accumulate]
            for i, (x, y) in enumerate(micro):
                last = i == len(micro) - 1
                with listener.batch(), model.no_sync() if not last else _nothing():
                    F.cross_entropy(model(x), y).div(accumulate).backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        with torch.no_grad(), listener.batch():
            F.cross_entropy(model(data[0][0]), data[0][1])
    dist.barrier()  # every rank done before the log is read
    # DDP's reducer holds the process group: free it (and any cycle it is in) before the
    # group is destroyed, so that no gloo object is torn down later, at interpreter exit
    del model, opt, listener
    gc.collect()
    dist.destroy_process_group()
    if rank == 0:
        print(f"rank 0 of {world}: log in {out}")


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/ddp"))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--ranks", default="0", help="ranks that record: 0 (default), 0,1 or all")
    p.add_argument("--find-unused-parameters", action="store_true", help="DDP's option")
    p.add_argument("--static-graph", action="store_true", help="DDP's option")
    args = p.parse_args(argv)
    if "RANK" not in os.environ:
        p.error("run me with torchrun --nproc_per_node 2")
    train(
        args.out,
        steps=args.steps,
        accumulate=args.accumulate,
        ranks=args.ranks,
        find_unused_parameters=args.find_unused_parameters,
        static_graph=args.static_graph,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
