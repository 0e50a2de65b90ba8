"""Keras integration: ``model.fit(..., callbacks=[TracelogCallback("runs/x")])``.

The callback opens a tracelog batch window around each training and each
validation batch. Recording needs the batches to run eagerly: compile with
``run_eagerly=True``. Under a traced ``tf.function`` (Keras' default) the
ops are built once and replayed by TensorFlow without Python, so those
batches are counted as unrecorded with that reason; the log says which
settings the run had.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import keras

from tracelog.adapters.tensorflow import TFListener

logger = logging.getLogger("tracelog")


class TracelogCallback(keras.callbacks.Callback):
    def __init__(self, log_dir: str | os.PathLike[str], **options: Any) -> None:
        super().__init__()
        self.log_dir = log_dir
        self.options = options
        self.listener: TFListener | None = None
        self._open: Any = None

    # -- the run ---------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.listener is None:
            self.listener = TFListener(self.model, self.log_dir, **self.options)
        run_eagerly = bool(getattr(self.model, "run_eagerly", False))
        self.listener.log.framework.update(
            {
                "mode": "eager" if run_eagerly else "graph",
                "run_eagerly": run_eagerly,
                "jit_compile": bool(getattr(self.model, "jit_compile", False)),
            }
        )
        if not run_eagerly:
            logger.warning(
                "tracelog: model.fit runs a traced tf.function; compile with run_eagerly=True "
                "to record its batches"
            )

    def on_train_end(self, logs: dict | None = None) -> None:
        self._close_window()
        if self.listener is not None:
            self.listener.close()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.listener is not None:
            self.listener.set_epoch(epoch)

    # -- batches ----------------------------------------------------------------------
    def _open_window(self) -> None:
        if self.listener is None:
            self.listener = TFListener(self.model, self.log_dir, **self.options)
        self._close_window()
        self._open = self.listener.batch()
        self._open.__enter__()

    def _close_window(self) -> None:
        if self._open is not None:
            ctx, self._open = self._open, None
            ctx.__exit__(None, None, None)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._open_window()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._close_window()

    def on_test_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._open_window()

    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._close_window()


__all__ = ["TracelogCallback"]
