"""``torch.distributed`` runs: which ranks record, where each writes, and a
sample's gradients taken before DDP averages them.

DDP's reducer all-reduces gradients from hooks it adds *after* each
parameter's gradient accumulator (``grad_accumulator->add_post_hook`` in
``torch/csrc/distributed/c10d/reducer.cpp``), then writes the averaged
gradients into ``param.grad``. A tensor hook (``param.register_hook``) runs
*before* the accumulator, so it sees this rank's own gradient of this
backward; the sample batch takes its gradients from such hooks, installed for
that window only. The float64 reference is a local replay of the tape, with
no DDP in it, so both sides of ``tracelog check`` are rank 0's micro-batch.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tracelog.adapters.base import describe

logger = logging.getLogger("tracelog")

Ranks = int | str | Sequence[int]


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module DistributedDataParallel wraps: the model recorded, its
    parameters named as in the user's module (no ``module.`` prefix)."""
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    while ddp is not None and isinstance(model, ddp):
        model = model.module
    return model


def world() -> dict[str, Any] | None:
    """This process's place in a distributed run; None for a single process.
    Read from ``torch.distributed`` once initialised, else from torchrun's
    environment (a listener made before ``init_process_group``)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        size = dist.get_world_size()
        if size <= 1:
            return None
        return {"backend": str(dist.get_backend()), "world_size": size, "rank": dist.get_rank()}
    try:
        size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None
    return None if size <= 1 else {"backend": "unknown", "world_size": size, "rank": rank}


def placement(
    ranks: Ranks, log_dir: str | os.PathLike[str], facts: dict[str, Any] | None
) -> tuple[bool, str | os.PathLike[str]]:
    """Does this rank record, and into which directory? ``ranks`` is one rank
    (default 0: it writes ``log_dir``), ``"all"`` or a list of ranks (each
    writes ``log_dir/rank<N>``: ranks never share a directory)."""
    if isinstance(ranks, bool) or not (
        isinstance(ranks, int)
        or ranks == "all"
        or (
            isinstance(ranks, Sequence)
            and not isinstance(ranks, str)
            and all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)
        )
    ):
        raise ValueError(f"ranks must be a rank, a list of ranks or 'all', got {ranks!r}")
    if facts is None:  # a single process records, whatever ranks says
        return True, log_dir
    rank = int(facts["rank"])
    if isinstance(ranks, int):
        return rank == ranks, log_dir
    if ranks == "all" or rank in ranks:
        return True, Path(log_dir) / f"rank{rank}"
    return False, log_dir


def facts_for_log(facts: dict[str, Any], ranks: Ranks) -> dict[str, Any]:
    """trace.json's ``distributed``: where this log came from."""
    recorded: Any = ranks if isinstance(ranks, (int, str)) else sorted(ranks)
    return {
        **facts,
        "recording_ranks": recorded,
        "note": (
            "counts are this rank's forward passes (every rank runs one per step); "
            "optimizer steps are global steps; the sample's gradients are this rank's "
            "own, before the all-reduce"
        ),
    }


class LocalGrads:
    """This backward's gradient of each trainable parameter, as autograd hands
    it to the parameter's accumulator (before DDP's reducer sees it)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.grads: dict[str, torch.Tensor] = {}
        self._handles = [
            p.register_hook(functools.partial(self._keep, name))
            for name, p in model.named_parameters()
            if p.requires_grad
        ]
        self.failed: str | None = None

    def _keep(self, name: str, grad: torch.Tensor) -> None:
        try:
            g = grad.detach().clone()  # the reducer may reuse the tensor: a copy
            kept = self.grads.get(name)
            self.grads[name] = g if kept is None else kept + g
        except Exception as e:  # fail open: the sample loses its gradients, training goes on
            self.failed = describe(e)
            logger.warning("tracelog: a sample gradient was not kept: %s", self.failed)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
