"""The Hugging Face ``Trainer`` callback: a TorchListener whose windows are
the Trainer's micro-batches.

The model the Trainer trains is the root; its loss is computed inside its
forward (``labels=``), as the listener records any Hugging Face model: the
loss graph is split from the predictions by what it reads. Hooks:
``on_step_begin`` opens a window for the first micro-batch of an optimizer
step, ``on_substep_end`` closes it and opens the next micro-batch's (gradient
accumulation: each forward is a batch of its graphs), ``on_step_end`` closes
the last (the optimizer step falls inside, in neither graph; the optimizer
steps are counted beside the batches). The evaluation loop has no hook before
a batch: each forward of the model in eval mode outside a training window is
an eval batch of its own. Recording fails open: a problem in it never stops
training. A step whose model forward raises (the Trainer has no hook for it)
ends its window there, counted unrecorded, and the log is checkpointed: what
was recorded before is on disk, and no recording outlives ``train()``.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import weakref
from typing import Any

from tracelog.adapters.base import describe
from tracelog.log import COMPLETE

from .listener import TorchListener

logger = logging.getLogger("tracelog")

try:
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tracelog.transformers needs transformers: pip install 'tracelog[transformers]'"
    ) from None


class TracelogCallback(TrainerCallback):
    """Records a Hugging Face ``Trainer.train`` run into ``log_dir``.

    ``Trainer(..., callbacks=[TracelogCallback("runs/x")])``. Options are the
    listener's (``overwrite``, ``checkpoint_every_s``, ...; see
    ``tracelog.adapters.torch.TorchListener``); ``record_eval=False`` leaves
    evaluation batches out. The listener attaches when training begins and
    the log is complete when it ends. With ``record_after_train=True`` it
    stays attached: a ``trainer.evaluate()`` or ``trainer.predict()`` after
    ``train()`` adds its batches as eval batches, the log rewritten complete
    after each (the Trainer has no hook before them, so until ``close()`` or
    the interpreter's exit, any forward of the model in eval mode counts,
    ``model.generate()``'s included).
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        record_eval: bool = True,
        record_after_train: bool = False,
        **options: Any,
    ) -> None:
        self.log_dir = log_dir
        self.record_eval = record_eval
        self.record_after_train = record_after_train
        self._trained = False  # train() has ended: the log is complete on disk
        self.options = options
        self.listener: TorchListener | None = None
        self._open: Any = None
        self._raised_hook: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if self.listener is not None or model is None:
            return
        # a log already in log_dir raises here, before training (LogExistsError)
        self.listener = TorchListener(model, self.log_dir, **self.options)
        self.listener.eval_windows = self.record_eval
        # after the listener's own hooks: they have seen the forward end
        self._raised_hook = model.register_forward_hook(self._after_forward, always_call=True)

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        """The model's forward ended; if by an exception (always_call hooks run
        inside torch's except block), end the step's window with it and
        checkpoint, as train() is about to raise."""
        error = sys.exc_info()[1]
        listener = self.listener
        if error is None or listener is None or listener.closed:
            return
        cm, self._open = self._open, None
        try:
            if cm is not None:
                listener.close_batch(cm, error)
            listener.writer.checkpoint()
        except Exception as e:  # fail open: the user's error propagates, not ours
            logger.warning("tracelog: checkpoint after a failed step: %s", describe(e))

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.listener is not None:
            self.listener.set_epoch(round(state.epoch or 0))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_window()  # one left open by a step that raised
        self._open_window()

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_window()
        self._open_window()  # the next micro-batch of this optimizer step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_window()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_window()
        if self._raised_hook is not None:
            self._raised_hook.remove()
            self._raised_hook = None
        if not self.record_after_train:
            self.close()
            return
        self._trained = True
        self._write_complete()
        # atexit runs last-registered first: this closes the log (complete)
        # before the listener's own handler would mark it interrupted
        atexit.register(_close_at_exit, weakref.ref(self))

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._write_complete()  # after train() only: its eval batches are counted

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any, **kwargs: Any) -> None:
        self._write_complete()

    def close(self) -> None:
        """Write the log (complete) and detach from the model."""
        if self.listener is not None:
            self.listener.close()

    def _write_complete(self) -> None:
        listener = self.listener
        if not self._trained or listener is None or listener.closed or listener.inert:
            return
        listener.writer.checkpoint(weights=True, state=COMPLETE)

    def _open_window(self) -> None:
        listener = self.listener
        if listener is None or listener.closed:
            return
        try:
            self._open = listener.open_batch()
        except Exception as e:  # fail open: the batch runs unrecorded
            if listener.strict:
                raise
            logger.warning("tracelog: batch not recorded: %s", describe(e))

    def _close_window(self) -> None:
        cm, self._open = self._open, None
        if cm is None or self.listener is None:
            return
        try:
            self.listener.close_batch(cm)
        except Exception as e:  # fail open
            if self.listener.strict:
                raise
            logger.warning("tracelog: batch not recorded: %s", describe(e))


def _close_at_exit(ref: weakref.ref[TracelogCallback]) -> None:
    callback = ref()
    if callback is not None:
        callback.close()


__all__ = ["TracelogCallback"]
