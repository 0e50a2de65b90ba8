"""What the PyTorch and TensorFlow listeners share: the epoch, per-phase batch
counters, the open/nesting checks of ``listener.batch()``, counting a batch
unrecorded (warning once per reason), and the context-manager protocol. The
adapters keep what differs: how ops are seen and how a batch is recorded."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from tracelog.log import TraceLog

logger = logging.getLogger("tracelog")


class ListenerBase:
    log: TraceLog

    def __init__(self, log: TraceLog) -> None:
        self.log = log
        self.epoch = 0
        self._window: Any = None
        self._counters: dict[tuple[int, str], int] = {}
        self._errors_logged: set[str] = set()
        self._closed = False

    # -- public API ----------------------------------------------------------------------
    def epochs(self, n: int) -> Iterator[int]:
        """``for epoch in listener.epochs(3):`` sets the epoch of later batches."""
        for e in range(n):
            self.epoch = e
            yield e

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def close(self) -> TraceLog:  # pragma: no cover - each adapter writes its own log
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- for the adapters --------------------------------------------------------------------
    def _open_batch(self, epoch: int | None) -> None:
        """The checks at the start of ``listener.batch()``."""
        if self._closed:
            raise RuntimeError("this listener is closed")
        if self._window is not None:
            raise RuntimeError("listener.batch() windows cannot nest")
        if epoch is not None:
            self.epoch = int(epoch)

    def _next_batch(self, phase: str) -> int:
        """The index of the next batch of this epoch and phase."""
        key = (self.epoch, phase)
        index = self._counters.get(key, 0)
        self._counters[key] = index + 1
        return index

    def _count_unrecorded(self, phase: str, epoch: int, batch: int, error: str | None) -> None:
        reason = error or "unknown error"
        self.log.count_failure(phase, epoch, batch, reason)
        if reason not in self._errors_logged:
            self._errors_logged.add(reason)
            logger.warning(
                "tracelog: batch (epoch %d, batch %d) not recorded: %s", epoch, batch, reason
            )
