"""The Lightning callback: a TorchListener whose windows are Lightning's batches.

The LightningModule is the root. A training step is the root's call (its
batch the data inputs), whatever submodules it calls: its predictions are the
outputs of its last top-level call of a module that holds parameters
(``self.net(x)``, ``self(x)``), and its loss is the tensor Lightning hands to
``on_before_backward``. ``self.log``/``self.log_dict`` and torchmetrics
metrics run with recording paused, so they never enter the graphs. Validation
batches are eval batches (their loss: the step's returned loss, else its last
float scalar after the predictions); the sanity check's are not recorded.

Hooks: ``on_train_batch_start`` opens a window, ``on_before_backward`` marks
the loss and ends the step's prediction part, ``on_train_batch_end`` closes
it (the backward and the optimizer step fall inside, in neither graph).
Recording fails open: a problem in it never stops training.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

import torch

from tracelog.adapters.base import describe

from .listener import TorchListener

logger = logging.getLogger("tracelog")


def _lightning() -> Any:
    """``lightning.pytorch``, or the older ``pytorch_lightning`` package."""
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:
        try:
            return importlib.import_module("pytorch_lightning")
        except ImportError:
            raise ImportError(
                "tracelog.lightning needs Lightning: pip install 'tracelog[lightning]'"
            ) from None


_Callback: Any = _lightning().Callback


class TracelogCallback(_Callback):
    """Records a Lightning ``Trainer.fit`` run into ``log_dir``.

    ``trainer = Trainer(callbacks=[TracelogCallback("runs/x")])``. Options are
    the listener's (``overwrite``, ``checkpoint_every_s``, ...; see
    ``tracelog.adapters.torch.TorchListener``); ``record_validation=False``
    leaves validation batches out. The log is complete when ``fit`` ends.
    """

    def __init__(
        self, log_dir: str | os.PathLike[str], *, record_validation: bool = True, **options: Any
    ) -> None:
        super().__init__()
        self.log_dir = log_dir
        self.record_validation = record_validation
        self.options = options
        self.listener: TorchListener | None = None
        self._open: Any = None

    # -- the run ----------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.listener is not None:
            return
        # a log already in log_dir raises here, before training (LogExistsError)
        self.listener = TorchListener(pl_module, self.log_dir, **self.options)
        self.listener.quiet(pl_module, "log", "log_dict")  # logging: never in the graphs

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.listener is not None:
            self.listener.set_epoch(trainer.current_epoch)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._close_window()
        if self.listener is not None:
            self.listener.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close_window(exception)
        if self.listener is not None:
            self.listener.abandon()  # the log stays, marked interrupted

    # -- training batches ---------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._start(batch)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        self._loss(loss)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._close_window()

    # -- validation batches ------------------------------------------------------------
    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.record_validation and not trainer.sanity_checking:
            self._start(batch)

    def on_validation_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._open is None:
            return
        if isinstance(outputs, dict):
            outputs = outputs.get("loss")
        if isinstance(outputs, torch.Tensor) and outputs.dim() == 0:
            self._loss(outputs)
        else:
            self._end_step()
        self._close_window()

    # -- windows -------------------------------------------------------------------------
    def _start(self, batch: Any) -> None:
        listener = self.listener
        if listener is None or listener.closed:
            return
        self._close_window()  # one left open by a step that raised
        try:
            self._open = listener.open_batch()
        except Exception as e:  # fail open: the batch runs unrecorded
            if listener.strict:
                raise
            logger.warning("tracelog: batch not recorded: %s", describe(e))
            return
        w = listener.window
        if w is not None:
            w.guarded(w.start_step, batch)

    def _loss(self, loss: torch.Tensor) -> None:
        w = self.listener.window if self.listener is not None else None
        if w is not None and w.step and not w.root_done:
            w.guarded(w.mark_loss, loss)
        self._end_step()

    def _end_step(self) -> None:
        w = self.listener.window if self.listener is not None else None
        if w is not None:
            w.guarded(w.end_step)

    def _close_window(self, error: BaseException | None = None) -> None:
        cm, self._open = self._open, None
        if cm is None or self.listener is None:
            return
        try:
            self.listener.close_batch(cm, error)
        except Exception as e:  # fail open
            if self.listener.strict:
                raise
            logger.warning("tracelog: batch not recorded: %s", describe(e))


__all__ = ["TracelogCallback"]
