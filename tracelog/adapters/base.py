"""What the PyTorch and TensorFlow listeners share.

``WindowBase`` is one batch window: the tape and the bookkeeping that fills it
(module enter/exit and where the model's forward starts and ends, binding the
data inputs and predictions, which region an op falls in, turning a tensor
into a TArg, targets and constants met from outside, recording an op, the
loss, failing open). ``ListenerBase`` is the listener around it: epochs and
per-phase batch counters, the ``listener.batch()`` flow, counting a batch
unrecorded (warning once per reason), building and deduplicating the graphs
of a batch, taking the sample, and writing the log on ``close()``.

An adapter subclasses both and keeps only what differs: how it sees ops and
tensors (a dispatch mode or an op callback; ``torch.Tensor`` or
``tf.Tensor``), how it names inputs and outputs, which tensor is the loss,
and how it takes gradients for the sample.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracelog.adapters import collector
from tracelog.adapters.builder import (
    Builder,
    Converter,
    Draws,
    input_names,
    output_roles,
    target_names,
    user_names,
)
from tracelog.adapters.tape import (
    ConstInfo,
    Rec,
    Ref,
    Tape,
    TArg,
    batch_multiple,
    symbolic_shape,
)
from tracelog.emit.runtime.parity import NEAR_ZERO
from tracelog.ir import Graph, batch_dim
from tracelog.log import COMPLETE, CheckpointPolicy, LogWriter, TraceLog, claim_log_dir
from tracelog.registry import Table
from tracelog.sample import (
    LOSS_KEY,
    build_sample,
    custom_backward_key,
    grad_key,
    reference_key,
    sample_info,
    scale_key,
    without_reference,
)

logger = logging.getLogger("tracelog")

# ref kinds that come from the model: a data input, a parameter, a buffer, a recorded op
MODEL_KINDS = ("i", "p", "b", "o")
LOSS_NOT_COMPUTED = "listener.loss() got a tensor that was not computed in this batch"

Counted = tuple[str, str | None]  # (prediction hash, loss hash or None)


def describe(e: BaseException) -> str:
    """An exception as one line of a log's failure list."""
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


class WindowBase(ABC):
    """One batch window: its tape and the bookkeeping to fill it. A framework
    says how it sees a tensor (``dtype_of``, ``shape_of``, ...) and names its
    inputs and outputs; ops reach ``record`` through the framework's ``on_op``."""

    listener: ListenerBase
    # a tensor the loss meets from outside with k*B rows is a target too (its
    # batch replay knows how to grow it), not only one with B rows
    merged_targets = False
    # is autograd recording the op now (False inside torch.no_grad()): a
    # framework with a grad mode says; the others always record gradients
    grad_enabled: Callable[[], bool] = staticmethod(lambda: True)

    def __init__(self, listener: ListenerBase, phase: str, epoch: int, batch: int) -> None:
        self.listener = listener
        self.phase, self.epoch, self.batch = phase, epoch, batch  # batch -1: set at the end
        self.tape = Tape()
        self.refs: dict[int, Ref] = {}
        # each ref's TArg, made once: a value's type never changes (a write in
        # place makes a new ref), and a parameter is an argument of every batch's ops
        self.targs: dict[Ref, TArg] = {}
        self.taint: set[Ref] = set()  # refs derived from the data inputs
        self.keep: list[Any] = []  # keeps ids stable for the window's life
        self.rec_out: list[list[Any]] = []
        self.stack: list[tuple[str, str]] = []  # (module path, class name)
        self.root_depth = 0
        self.root_calls = 0
        self.root_done = False
        self.recording = True
        self.error: str | None = None
        self.explicit_loss: Ref | None = None
        self.last_scalar: Ref | None = None
        # a step window's loss is computed inside the root's call: its float
        # scalars count as the loss from there too (set by the adapter)
        self.scalars_in_pred = False
        self.input_tensors: dict[str, Any] = {}
        self.output_tensors: dict[str, Any] = {}
        self.target_tensors: list[Any] = []
        self.before: StateBefore | None = None  # set where this window may give the sample
        self.reference: BackgroundCall | None = None  # its float64 reference, being computed

    # -- how the framework sees a tensor -------------------------------------------------
    @abstractmethod
    def dtype_of(self, t: Any) -> str:
        raise NotImplementedError

    @abstractmethod
    def shape_of(self, t: Any) -> tuple[int, ...]:
        raise NotImplementedError

    @abstractmethod
    def is_float_scalar(self, t: Any) -> bool:
        raise NotImplementedError

    @abstractmethod
    def digest_of(self, t: Any) -> str:
        """The digest of a constant's contents (dtype, shape and bytes)."""
        raise NotImplementedError

    @abstractmethod
    def named_inputs(self, args: Any, kwargs: Any) -> list[tuple[str, Any]]:
        """The data tensors of the root module's first call, by input name."""
        raise NotImplementedError

    @abstractmethod
    def named_outputs(self, output: Any) -> list[tuple[str, Any]]:
        """The root module's prediction tensors, by role."""
        raise NotImplementedError

    @abstractmethod
    def mask(self, rec_index: int) -> np.ndarray:
        """The keep mask (bool) the dropout record ``rec_index`` drew."""
        raise NotImplementedError

    # -- failing open -----------------------------------------------------------------
    def fail(self, e: BaseException) -> None:
        """Stop recording this batch (strict listeners raise instead)."""
        if self.listener.strict:
            raise e
        self.stop(describe(e))

    def stop(self, reason: str) -> None:
        self.recording = False
        self.error = reason

    def guarded(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` while recording; an exception fails the batch open."""
        if not self.recording:
            return
        try:
            fn(*args)
        except Exception as e:  # fail open: training goes on, the batch is unrecorded
            self.fail(e)

    # -- module calls -------------------------------------------------------------------
    def enter_module(self, path: str, tname: str, is_root: bool, args: Any, kwargs: Any) -> None:
        if is_root:
            if self.root_depth == 0:
                self.root_calls += 1
                if self.root_calls == 1:
                    self.start_forward(args, kwargs)
            self.root_depth += 1
        self.stack.append((path, tname))

    def exit_module(self, is_root: bool, output: Any) -> None:
        if self.stack:
            self.stack.pop()
        if is_root:
            self.root_depth -= 1
            if self.root_depth == 0 and self.root_calls == 1:
                self.bind_outputs(self.named_outputs(output))
                self.root_done = True

    def start_forward(self, args: Any, kwargs: Any) -> None:
        """The root module's first call begins: bind its data inputs."""
        self.bind_inputs(self.named_inputs(args, kwargs))

    def bind_inputs(self, named: list[tuple[str, Any]]) -> None:
        """Data inputs: the batch size is the leading dim of the first one that has a dim."""
        for name, t in named:
            if id(t) in self.refs:
                # one tensor passed twice (model(ids, labels=ids)): ops cannot
                # tell the two apart, so it is one input, under its first name
                continue
            shape = self.shape_of(t)
            if self.tape.batch_size is None and len(shape) >= 1:
                self.tape.batch_size = int(shape[0])
            ref: Ref = ("i", name)
            self.refs[id(t)] = ref
            self.taint.add(ref)
            self.keep.append(t)
            self.input_tensors[name] = t
        for name, t in self.input_tensors.items():
            self.tape.inputs[name] = self.targ(t, ("i", name), True)

    def bind_outputs(self, named: list[tuple[str, Any]]) -> None:
        """Predictions: the root's outputs that recorded ops computed."""
        for role, t in named:
            ref = self.refs.get(id(t))
            if ref is None or ref[0] in ("c", "t"):
                continue
            self.tape.outputs.append((role, ref))
            self.output_tensors[role] = t

    # -- ops --------------------------------------------------------------------------
    def region(self) -> str | None:
        """Where an op now falls: "pred" inside the root's first call, "post"
        after it (the loss), None before it (data preparation)."""
        if self.root_depth > 0 and self.root_calls == 1:
            return "pred"
        if self.root_done:
            return "post"
        return None

    def from_model(self, tensors: Iterable[Any]) -> bool:
        """Does any of these tensors come from the model: a data input, a
        parameter, a buffer or a recorded op's output?"""
        for t in tensors:
            ref = self.refs.get(id(t))
            if ref is not None and ref[0] in MODEL_KINDS:
                return True
        return False

    def reduces_targets(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> bool:
        """An op after the forward, on the batch's targets, whose results have no
        batch dim (y.sum(), (labels != -100).sum(): a loss normalised by its
        positives or its tokens): recorded, its batch-sized inputs becoming
        targets. Left out as data preparation, the loss would meet its result as
        a constant of this batch's data: a graph per batch, and a guarded batch
        counted for another batch's graph."""
        batch = self.tape.batch_size
        if batch is None or batch < 2 or not outputs:
            return False
        if not any(
            (lead := self._lead(t))
            and lead % batch == 0
            and (self.refs.get(id(t)) is None or self.refs[id(t)][0] == "t")
            for t in inputs
        ):
            return False
        return all(not (lead := self._lead(o)) or lead % batch for o in outputs)

    def _lead(self, t: Any) -> int:
        shape = self.shape_of(t)
        return int(shape[0]) if shape else 0

    def targ(self, t: Any, ref: Ref, tainted: bool) -> TArg:
        return TArg(
            ref, self.dtype_of(t), symbolic_shape(self.shape_of(t), self.tape.batch_size, tainted)
        )

    def arg(self, t: Any, region: str) -> TArg:
        """A tensor argument of an op; a tensor from outside the window becomes
        a target or a constant."""
        ref = self.refs.get(id(t))
        if ref is None:
            ref = self.unknown(t, region)
            self.refs[id(t)] = ref
            self.keep.append(t)
        if ref[0] == "t":  # a target's type was set when it was met (a merged batch dim)
            return self.tape.targets[ref[1]]
        targ = self.targs.get(ref)
        if targ is None:
            targ = self.targs[ref] = self.targ(t, ref, ref in self.taint)
        return targ

    def unknown(self, t: Any, region: str) -> Ref:
        """A tensor from outside the window: a target when the loss region
        meets it with a batch-sized leading dim, else a constant."""
        shape = self.shape_of(t)
        batch = self.tape.batch_size
        lead = shape[0] if shape else 0
        merged = self.merged_targets and batch is not None and batch > 1 and lead % batch == 0
        if region == "post" and lead and batch is not None and (lead == batch or merged):
            ref: Ref = ("t", len(self.tape.targets))
            self.taint.add(ref)
            targ = self.targ(t, ref, True)
            if (
                lead != batch
            ):  # labels flattened with the batch (y.reshape(-1)): data, not a constant
                targ = targ._replace(shape=(batch_dim(lead // batch), *targ.shape[1:]))
            self.tape.targets.append(targ)
            self.target_tensors.append(t)
            return ref
        if region == "pred" and batch is not None and batch > 1 and lead == batch:
            if self.dtype_of(t) == "bool":
                return self.external_mask(t)
        return self.constant(t, region)

    def external_mask(self, t: Any) -> Ref:
        """A boolean mask with a batch dim that the forward made from outside
        the framework (SpecAugment's time mask, drawn by numpy per batch, then
        torch.tensor): a data input of the graph, its value the batch's in the
        sample. As a constant, each batch's draw made a graph of its own, and
        every batch was recorded exactly (the guards cannot see its values)."""
        base = name = f"external_mask_{len(self.tape.external)}"
        k = 0
        while name in self.input_tensors:  # a forward argument of that name
            k += 1
            name = f"{base}_{k}"
        ref: Ref = ("i", name)
        self.taint.add(ref)
        self.input_tensors[name] = t
        self.tape.inputs[name] = self.targ(t, ref, True)
        self.tape.external.add(name)
        return ref

    def constant(self, t: Any, region: str) -> Ref:
        k = self._batch_multiple(t) if region == "post" else 0
        if k:
            # computed from the data input's shape in the graph (builder._batch_scalar)
            ref: Ref = ("n", self.dtype_of(t), len(self.shape_of(t)), *((k,) if k > 1 else ()))
            self.taint.add(ref)
            return ref
        ref = ("c", len(self.tape.consts))
        self.tape.consts.append(ConstInfo(t, self.digest_of(t)))
        return ref

    def one_value(self, t: Any) -> float | None:
        """A one-element tensor's value (None for any other)."""
        return None

    def _batch_multiple(self, t: Any) -> int:
        """k for a one-element constant equal to k times the batch size, met in
        the loss (0 for any other): a mean reduction divides by the number of
        samples (k = 1: Keras' losses, F.kl_div(reduction="batchmean"),
        `loss.sum() / x.shape[0]`), or of per-step losses (the element count
        of a batch-derived value recorded), computed from shapes as numbers."""
        batch = self.tape.batch_size
        if batch is None or batch < 2:
            return 0
        value = self.one_value(t)
        if value is None:
            return 0
        if value == float(batch):
            return 1
        return batch_multiple(self.tape, value)

    def record(
        self,
        op: str,
        region: str,
        args: tuple[Any, ...],
        kwargs: tuple[tuple[str, Any], ...],
        outs: list[Any],
        n_returned: int,
        tainted: bool,
        func: Any,
        mutated: tuple[int, ...] = (),
    ) -> int:
        """Append one op to the tape: ``outs`` are its returned tensors, then
        those it wrote in place. Returns the record's index."""
        index = len(self.tape.recs)
        targs = []
        for k, t in enumerate(outs):
            ref: Ref = ("o", index, k)
            if tainted:
                self.taint.add(ref)
            self.refs[id(t)] = ref
            self.keep.append(t)
            targ = self.targs[ref] = self.targ(t, ref, tainted)
            targs.append(targ)
        self.rec_out.append(outs)
        module = self.stack[-1] if self.stack else ("", "")
        self.tape.recs.append(
            Rec(
                index,
                op,
                region,
                module,
                args,
                kwargs,
                tuple(targs),
                n_returned,
                tainted,
                func,
                mutated,
                self.grad_enabled(),
            )
        )
        if region == "post" or self.scalars_in_pred:
            for k, t in enumerate(outs[:n_returned]):
                if self.is_float_scalar(t):
                    self.last_scalar = ("o", index, k)
                    break  # an op's first scalar: nll_loss's second is its total weight
        return index

    # -- the loss -----------------------------------------------------------------------
    def mark_loss(self, t: Any) -> None:
        ref = self.refs.get(id(t))
        if ref is None:
            raise ValueError(LOSS_NOT_COMPUTED)
        self.explicit_loss = ref

    def loss_ref(self) -> Ref | None:
        return self.explicit_loss or self.last_scalar

    def named_loss_output(self) -> Ref | None:
        """A float scalar the root returned under the name ``loss`` (a Hugging
        Face model given ``labels=``): the loss of a batch that runs no backward."""
        for role, ref in self.tape.outputs:
            if role.rpartition(".")[2] == "loss" and self.is_float_scalar(
                self.output_tensors[role]
            ):
                return ref
        return None

    def drop_loss_output(self, loss: Ref) -> None:
        """A loss computed after the forward from the loss the forward returned
        (``outputs.loss / steps``): that output is no prediction; the loss
        graph holds the forward's loss ops too (``Tape.forward_loss``)."""
        inner = self.named_loss_output()
        if inner is None or inner == loss:
            return
        for role in [role for role, ref in self.tape.outputs if ref == inner]:
            self.output_tensors.pop(role, None)  # by role: an in-place `loss *= k` renamed it
        self.tape.outputs = [(role, ref) for role, ref in self.tape.outputs if ref != inner]
        self.tape.forward_loss = True

    def take_loss_output(self, loss: Ref) -> bool:
        """The loss is one of the root's outputs (computed inside the forward):
        it leaves the predictions, and the tape's loss is that output."""
        roles = [role for role, ref in self.tape.outputs if ref == loss]
        if not roles:
            return False
        self.tape.outputs = [(role, ref) for role, ref in self.tape.outputs if ref != loss]
        for role in roles:
            self.output_tensors.pop(role, None)
        self.tape.loss = loss
        return True

    def tensor(self, ref: Ref) -> Any:
        if ref[0] == "o":
            return self.rec_out[ref[1]][ref[2]]
        if ref[0] == "i":
            return self.input_tensors[ref[1]]
        raise KeyError(ref)


class BackgroundCall:
    """``fn()`` run on a daemon thread from now; ``result()`` waits for it and
    returns its value or raises its exception. Daemon: a run that ends (or
    crashes) before the result is asked for is not held up by it."""

    def __init__(self, fn: Callable[[], Any] | None, name: str) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if fn is not None:
            self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
            self._thread.start()

    @classmethod
    def failed(cls, error: BaseException) -> BackgroundCall:
        """A call that failed before it could start: ``result()`` raises ``error``."""
        call = cls(None, "")
        call._error = error
        return call

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # handed to result(): the caller decides
            self._error = e

    def result(self) -> Any:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


@dataclass
class StateBefore:
    """The model's state when a sampled batch began, as arrays; ``grad_state``
    is what the framework needs to take that batch's gradients at the end."""

    params: dict[str, np.ndarray]
    buffers: dict[str, np.ndarray]
    grad_state: Any = None


class _BatchWindow:
    """``listener.batch()``: a class, not a generator-based context manager:
    on a guarded batch of a small model its few calls are a visible part of
    the cost (issue 18)."""

    __slots__ = ("listener", "epoch", "watched")

    def __init__(self, listener: ListenerBase, epoch: int | None) -> None:
        self.listener, self.epoch = listener, epoch
        self.watched: Any = None

    def __enter__(self) -> Any:
        listener = self.listener
        # the checks at the start of every batch, inline (a call each costs a guarded batch)
        if listener._closed:
            raise RuntimeError("this listener is closed")
        if listener._window is not None:
            raise RuntimeError("listener.batch() windows cannot nest")
        if self.epoch is not None:
            listener.epoch = int(self.epoch)
        if listener.inert:
            return listener
        w = listener._window = listener._begin_window()
        try:
            watched = listener._watching(w, w.before)
            watched.__enter__()
        except BaseException as e:
            self._end(e)
            raise
        self.watched = watched
        listener._open_window = self
        return listener

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        watched = self.watched
        if watched is None:  # an inert listener's, or one close() ended
            return
        self.watched = None
        self.listener._open_window = None
        try:
            watched.__exit__(exc_type, exc, tb)
        finally:
            self._end(exc)

    def _end(self, raised: BaseException | None) -> None:
        listener = self.listener
        # the window now open: a later micro-batch's where the adapter split the batch
        w, listener._window = listener._window, None
        if raised is None and listener._end_guarded(w):
            return  # the usual guarded batch, counted in one call
        try:
            listener._end_window(w, raised)
        finally:
            del w  # its tape is freed here, before _window_closed
            listener._window_closed()


class ListenerBase(ABC):
    """A listener: ``with listener.batch():`` around each batch, ``close()`` at the end."""

    log: TraceLog
    rules: Table[Converter]  # the source-op -> IR rule table
    # the failure reasons logs have always carried
    no_forward_reason = "the model was not called inside the batch window"
    raised_reason = "the batch raised {}"
    # the sample's float64 reference computed on a helper thread while the batch's
    # graphs are built (an adapter whose replay is safe off the training thread)
    reference_in_background = False

    def __init__(
        self,
        log: TraceLog,
        model: Any,
        log_dir: str | os.PathLike[str],
        *,
        strict: bool = False,
        overwrite: bool = False,
        checkpoint_every_s: float = 5.0,
        checkpoint_every_batches: int | None = None,
        checkpoint_weights: bool = False,
        inert: bool = False,
    ) -> None:
        """The options every listener takes (``TorchListener(model, log_dir,
        **options)``, ``TFListener``, ``tracelog.Listener``):

        - ``overwrite``: replace a log already in ``log_dir`` (and the programs
          emitted from it); without it such a directory raises LogExistsError;
        - ``checkpoint_every_s``, ``checkpoint_every_batches``: how often the
          counts reach disk (new graphs and the sample always do at once); by
          default every 5 s or 200 batches, those spaced so that checkpoints
          cost at most 1% of the run's time (a number of batches given is kept);
        - ``checkpoint_weights``: rewrite the weights at every checkpoint too;
        - ``strict``: raise recording errors instead of failing open (tests).

        ``inert`` (set by an adapter, not a user option): this process records
        nothing and writes nothing (a distributed rank that does not record);
        every method keeps its contract, so the training loop is the same code
        on every rank.
        """
        policy = CheckpointPolicy(checkpoint_every_s, checkpoint_every_batches, checkpoint_weights)
        self.inert = inert
        if not inert:
            claim_log_dir(log_dir, overwrite)  # before training: never a silent overwrite
        self.log = log
        self.model = model
        self.log_dir = log_dir
        self.strict = strict  # raise recording errors instead of failing open (for tests)
        self.writer = LogWriter(log, log_dir, self._weights, policy, self._model_facts)
        self._sample_failed = False
        self.epoch = 0
        self._window: Any = None
        self._open_window: _BatchWindow | None = None  # the batch() entered and not exited
        self._counters: dict[tuple[int, str], int] = {}
        self._errors_logged: set[str] = set()
        self._closed = False
        self._collector_paused = False  # does this listener hold a collector.pause()?
        self._cache: dict[Any, tuple[str, str | None, Draws]] = {}
        self._sample: dict[str, np.ndarray] | None = None
        # what the last window counted: (prediction hash, loss hash) or the reason it was not
        self.last_counted: Counted | str | None = None
        # a listener never closed still leaves its log, marked interrupted, at interpreter exit
        self._at_exit = functools.partial(_flush_at_exit, weakref.ref(self))
        if not inert:
            atexit.register(self._at_exit)

    # -- public API ----------------------------------------------------------------------
    def epochs(self, n: int) -> Iterator[int]:
        """``for epoch in listener.epochs(3):`` sets the epoch of later batches."""
        for e in range(n):
            self.epoch = e
            yield e

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    @property
    def closed(self) -> bool:
        """Has ``close()`` written the log? A closed listener records nothing more."""
        return self._closed

    def batch(self, *, epoch: int | None = None) -> _BatchWindow:
        """The window of one batch: the forward, the loss and (optionally) the backward."""
        return _BatchWindow(self, epoch)

    def _begin_window(self) -> Any:
        """A new window, with the state a sample needs while none is taken."""
        w = self._new_window()
        if self._sample is None and not self._sample_failed:
            w.before = self._state_before(w)
        return w

    def _pause_collector(self) -> None:
        """The recorder starts on a window: the garbage collector pauses until
        the window's objects are freed (collector.py: its collections would
        only scan and promote the tape)."""
        if not self._collector_paused:
            self._collector_paused = True
            collector.pause()

    def _resume_collector(self) -> None:
        if self._collector_paused:
            self._collector_paused = False
            collector.resume()

    def _window_closed(self) -> None:
        """A ``batch()`` window ended and its objects are freed."""
        self._resume_collector()

    def _end_guarded(self, w: Any) -> bool:
        """End ``w`` if it is the usual guarded batch (one forward, its key the
        trusted one), counting it, and say so; False leaves it to
        ``_end_window``. On a small model every Python call of a guarded
        batch is a visible part of its cost (issue 18)."""
        return False

    def _end_window(self, w: WindowBase, raised: BaseException | None = None) -> None:
        """Count the window's batch, recorded or not, and take the sample from it."""
        if w.batch < 0:  # the phase is known once the model ran
            w.batch = self._next_batch(w.phase)
        if raised is not None:  # the user's error: never re-raised as a recording error
            w.stop(self.raised_reason.format(type(raised).__name__))
        self._finish(w, w.before)

    def loss(self, t: Any) -> Any:
        """Mark the loss of this batch (when it is not the last scalar computed)."""
        w = self._window
        if w is None:
            if self.inert:
                return t
            raise RuntimeError("listener.loss() must be called inside listener.batch()")
        try:  # not guarded by w.recording: a later error replaces an earlier one
            w.mark_loss(t)
        except Exception as e:
            w.fail(e)
        return t

    def close(self) -> TraceLog:
        """Write the final log (marked complete) and detach from the model.
        Idempotent and fail-open: a write that fails warns once, saying what
        is on disk, and returns."""
        return self._end(COMPLETE)

    def abandon(self) -> TraceLog:
        """End an unfinished run (atexit, a Keras ``fit`` that raised): write a
        last checkpoint with the weights, leave the log marked interrupted."""
        return self._end("interrupted")

    def _end(self, state: str) -> TraceLog:
        if self._closed:
            return self.log
        self._closed = True
        atexit.unregister(self._at_exit)
        if self.inert:
            self._detach()
            return self.log
        try:
            self._end_open_window()
            self._resume_collector()  # a window opened by open_batch and never closed
            self._detach()
        finally:
            self.writer.checkpoint(weights=True, state=state)
        return self.log

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _end_open_window(self) -> None:
        """close() with a batch window still open (``open_batch`` never closed,
        close() inside ``batch()``): the window ends here, as its exit would
        have ended it (its batch counted, recorded if it ran), and its
        recorder leaves: nothing records for a closed listener."""
        cm = self._open_window
        if cm is None:
            return
        try:
            cm.__exit__(None, None, None)
        except Exception as e:  # fail open: close() goes on
            logger.warning("tracelog: the open batch window could not be ended: %s", describe(e))

    # -- what each framework supplies ------------------------------------------------------
    @abstractmethod
    def _new_window(self) -> WindowBase:
        raise NotImplementedError

    @abstractmethod
    def _watching(self, w: Any, before: StateBefore | None) -> AbstractContextManager[Any]:
        """Seeing the window's ops while the batch runs."""
        raise NotImplementedError

    @abstractmethod
    def _state_before(self, w: Any) -> StateBefore | None:
        """The state a sample needs from the start of the batch; None for a
        batch that cannot be the sample."""
        raise NotImplementedError

    @abstractmethod
    def _close_tape(self, w: Any) -> None:
        """The batch ran: set the tape's loss and buffer updates."""
        raise NotImplementedError

    @abstractmethod
    def _trainable(self) -> dict[str, bool]:
        raise NotImplementedError

    @abstractmethod
    def _exact_tape(self, w: Any) -> Tape | None:
        """The tape with exact batch dims from a replay; None if it fails."""
        raise NotImplementedError

    @abstractmethod
    def _to_numpy(self, t: Any) -> np.ndarray:
        raise NotImplementedError

    @abstractmethod
    def _gradients(self, w: Any, before: StateBefore, loss: Any) -> dict[str, np.ndarray]:
        """The gradient of the loss for each trainable parameter that has one."""
        raise NotImplementedError

    @abstractmethod
    def _buffer_now(self, name: str) -> np.ndarray:
        raise NotImplementedError

    @abstractmethod
    def _detach(self) -> None:
        raise NotImplementedError

    @abstractmethod
    def _model_facts(self) -> dict[str, Any]:
        raise NotImplementedError

    @abstractmethod
    def _weights(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    # -- the flow ----------------------------------------------------------------------
    def _next_batch(self, phase: str) -> int:
        """The index of the next batch of this epoch and phase."""
        key = (self.epoch, phase)
        index = self._counters.get(key, 0)
        self._counters[key] = index + 1
        return index

    def _return_batch(self, epoch: int, phase: str) -> None:
        """Give back the index ``_next_batch`` gave last (the window's phase changed)."""
        key = (epoch, phase)
        self._counters[key] = max(0, self._counters.get(key, 0) - 1)

    def _count_unrecorded(self, phase: str, epoch: int, batch: int, error: str | None) -> None:
        reason = error or "unknown error"
        self.log.count_failure(phase, epoch, batch, reason)
        if reason not in self._errors_logged:
            self._errors_logged.add(reason)
            logger.warning(
                "tracelog: batch (epoch %d, batch %d) not recorded: %s", epoch, batch, reason
            )

    def _finish(self, w: WindowBase, before: StateBefore | None) -> None:
        try:
            if w.recording:
                self._record(w, before)
        except Exception as e:
            w.fail(e)
        if not w.recording:
            self.last_counted = w.error or "unknown error"
            self._count_unrecorded(w.phase, w.epoch, w.batch, w.error)
        self._batch_counted()

    def _batch_counted(self) -> None:
        """A batch was counted (once): checkpoint when one is due."""
        if self.strict:
            self.writer.batch_done()
            return
        try:
            self.writer.batch_done()  # fail-open inside; this guards the guard
        except Exception as e:
            logger.warning("tracelog: checkpoint failed: %s", describe(e))

    def _record(self, w: WindowBase, before: StateBefore | None) -> None:
        if w.root_calls == 0:
            raise RuntimeError(self.no_forward_reason)
        self._close_tape(w)
        sampled = before is not None and w.phase == "train"
        if sampled and self.reference_in_background:
            assert before is not None
            w.reference = self._reference_started(w, before)
        fp = w.tape.fingerprint()
        cached = self._cache.get(fp)
        if cached is None:
            pred, loss_graph, draws = self._graphs(w)
            ph = self.log.add_graph(pred)
            lh = self.log.add_graph(loss_graph) if loss_graph is not None else None
            cached = self._cache[fp] = (ph, lh, draws)
        ph, lh, draws = cached
        self.log.count(w.phase, ph, lh, w.epoch, w.batch)
        self.last_counted = (ph, lh)
        if before is not None and lh is not None and w.phase == "train":
            self._sample_guarded(w, before, ph, lh, draws)

    def _sample_guarded(
        self, w: WindowBase, before: StateBefore, ph: str, lh: str, draws: Draws
    ) -> None:
        """Take the sample; the batch is counted already, so a failure here only
        loses the sample (one warning, no retry: the next batch would fail alike)."""
        try:
            self._take_sample(w, before, ph, lh, draws)
        except Exception as e:
            if self.strict:
                raise
            self._sample, self.log.sample_info = None, None
            self._sample_failed = True
            logger.warning(
                "tracelog: the sample batch could not be taken (%s); the log will have no "
                "sample (emit works; check needs a sample)",
                describe(e),
            )
            return
        assert self._sample is not None
        self.writer.set_sample(self._sample)

    def _graphs(self, w: WindowBase) -> tuple[Graph, Graph | None, Draws]:
        """The batch's prediction and loss graphs (exact batch dims from a
        replay; the equal-size guess if it fails) and its dropout records."""
        trainable = self._trainable()
        tape = self._exact_tape(w) or w.tape
        builder = Builder(tape, trainable, self.log.constants, self.rules, self._to_numpy)
        builder.convert()
        return builder.graphs()

    def _take_sample(
        self, w: WindowBase, before: StateBefore, ph: str, lh: str, draws: Draws
    ) -> None:
        assert w.tape.loss is not None
        loss_t = w.tensor(w.tape.loss)
        array = self._to_array
        ir = input_names(w.tape)  # the IR's name of each data input
        taken = user_names(w.tape)
        roles = output_roles(w.tape, taken)  # and of each prediction output
        try:
            pending, w.reference = w.reference, None
            reference: dict[str, Any] | None = (
                pending.result() if pending is not None else self._reference64(w, before)
            )
            reference_note = "float64" if reference is not None else "not computed by this adapter"
        except Exception as e:  # the sample stands without it; check says why
            reference, reference_note = None, f"none: {describe(e)}"
        if reference is not None:
            reference["outputs"] = {roles[r]: a for r, a in reference["outputs"].items()}
        self._sample = build_sample(
            inputs={ir[name]: array(t) for name, t in w.input_tensors.items()},
            targets=dict(
                zip(target_names(w.tape, taken), map(array, w.target_tensors), strict=True)
            ),
            masks=[w.mask(rec_index) for rec_index in draws.prediction],
            loss_masks=[w.mask(rec_index) for rec_index in draws.loss],
            outputs={roles[role]: array(t) for role, t in w.output_tensors.items()},
            loss=array(loss_t),
            grads=self._gradients(w, before, loss_t),
            params=before.params,
            buffers=before.buffers,
            updates={name: self._buffer_now(name) for name, _ref in w.tape.buffer_updates},
            reference=reference,
        )
        off = None if reference is None else _reference_off(self._sample, _narrowest_eps(w.tape))
        if off is not None:  # not the batch the source ran: no reference, and check says why
            self._sample = without_reference(self._sample)
            reference, reference_note = None, f"none: {off}"
            logger.warning("tracelog: the sample has no float64 reference: %s", off)
        if reference is not None:
            self._sample.update(_custom_backwards(self._custom_functions(w), self._sample))
        self.log.sample_info = sample_info(
            epoch=w.epoch,
            batch=w.batch,
            phase=w.phase,
            prediction=ph,
            loss=lh,
            masks=len(draws.prediction),
            grads_from=self._grads_from(w),
            reference=reference_note,
            loss_masks=len(draws.loss),
        )

    def _custom_functions(self, w: Any) -> list[str]:
        """The custom autograd Functions the batch's forward ran (their own
        backward is not recorded); none where the adapter has no such thing."""
        return []

    def _to_array(self, t: Any) -> np.ndarray:
        """A tensor as an array the sample owns."""
        return self._to_numpy(t)

    def _reference64(self, w: Any, before: StateBefore) -> dict[str, Any] | None:
        """The batch replayed in float64 through the framework's own kernels:
        {"outputs": {tape role: array}, "loss", "grads": {param}, "updates":
        {buffer}}; None where the adapter has no replay; raises when it fails."""
        rest = self._reference64_forward(w, before)
        return None if rest is None else rest()

    def _reference64_forward(
        self, w: Any, before: StateBefore
    ) -> Callable[[], dict[str, Any]] | None:
        """``_reference64`` in two parts: its forward replay now, and the call
        that finishes it (the backward), which ``reference_in_background``
        runs on a helper thread. None where the adapter has no replay."""
        return None

    def _reference_started(self, w: Any, before: StateBefore) -> BackgroundCall:
        """The reference's forward replay, here; its backward on a helper thread
        while the batch's graphs are built (autograd's engine runs without the
        GIL, the batch-dim replay is Python), joined where the sample is taken."""
        try:
            rest = self._reference64_forward(w, before)
        except Exception as e:  # the sample stands without it, saying why
            return BackgroundCall.failed(e)
        if rest is None:  # this adapter has no replay: the sample says so
            return BackgroundCall(None, "")
        return BackgroundCall(rest, "tracelog-reference64")

    @abstractmethod
    def _grads_from(self, w: Any) -> str:
        """How the sample's gradients were taken, for trace.json."""
        raise NotImplementedError


# a float32 gradient further than this share of its largest value from the
# float64 reference is not rounding (the source's own error is 1e-6 .. 1e-4 of it)
_NOT_ROUNDING = 1e-2


# the source's own loss further than this many ulps (of the narrowest float dtype the
# batch computed in) of the loss's scale from the float64 reference's is not
# rounding: 2**16 float32 ulps are 7.8e-3 (as _NOT_ROUNDING for gradients), where
# 180 PyTorch and 32 Keras models of the matrices read at most 7.4e-5 (Keras
# ResNet50 at 32x32, batch 4) and a replay of another draw 0.13 (topk among ties);
# a bfloat16 or float16 run's bound is above 1: it is judged on float32 runs only
_REFERENCE_ULPS = 2.0**16


# float epsilons by dtype name (numpy has no bfloat16)
_EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10, "float32": 2.0**-23}


def _narrowest_eps(tape: Tape) -> float:
    """The epsilon of the narrowest float dtype among the batch's recorded
    values (float32's where none is narrower): a bfloat16 autocast region
    rounds the loss by its epsilon, whatever dtype the loss is computed in."""
    found = {o.dtype for rec in tape.recs for o in rec.outs}
    return max(eps for name, eps in _EPS.items() if name in found or name == "float32")


def _reference_off(sample: dict[str, np.ndarray], eps: float) -> str | None:
    """Why the float64 reference is not a replay of the sampled batch, if it is
    not: the source's own loss further from the reference's than rounding by
    `eps` (_narrowest_eps) explains, at the loss's scale (the larger of its value
    and how far rounding the predictions moves it: tracelog.sample.scale_key).
    A draw or data-dependent choice the replay did not take as the source did
    would make the reference, and every program that replays alike, agree on
    another function than the source's, where the float32 check judged the
    source's own error as large and passed (topk among tied values, 0.15 of the
    loss). None where it agrees, or the loss is not finite on either side."""
    loss, ref = sample.get(LOSS_KEY), sample.get(reference_key(LOSS_KEY))
    if loss is None or ref is None:
        return None
    own, want = float(np.asarray(loss, dtype=np.float64)), float(np.asarray(ref, dtype=np.float64))
    if not (np.isfinite(own) and np.isfinite(want)):
        return None
    scale = max(abs(want), float(np.asarray(sample.get(scale_key(LOSS_KEY), 0.0))))
    bound = _REFERENCE_ULPS * eps * scale
    if abs(own - want) <= bound:
        return None
    return (
        f"its loss {want:.9g} is {abs(own - want):.3g} from the batch's own {own:.9g} "
        f"(more than {bound:.3g}, {_REFERENCE_ULPS:g} ulps of its scale {scale:.3g}): the "
        f"float64 replay did not compute what the source did (a tracelog bug; please report it)"
    )


def _custom_backwards(functions: list[str], sample: dict[str, np.ndarray]) -> dict[str, Any]:
    """The sample's marks (custom_backward_key) of the gradients that differ
    from the float64 reference by more than rounding where the forward ran
    custom autograd Functions: their own backward (a gradient reversal, a
    straight-through estimator) is not the derivative of the ops recorded,
    which the reference and every program differentiate. Warns once."""
    if not functions:
        return {}
    marks: dict[str, Any] = {}
    pairs = [
        (key, grad, np.asarray(sample[reference_key(key)], dtype=np.float64))
        for key, grad in sample.items()
        if key.startswith(grad_key("")) and reference_key(key) in sample and grad.dtype.kind == "f"
    ]
    # a gradient zero in exact arithmetic (a key's bias before a softmax) is rounding
    # noise the size of the terms it sums: judged at a share of the typical gradient's
    # scale, as the parity check judges it (NEAR_ZERO of the median)
    scales = [float(np.abs(want[np.isfinite(want)]).max(initial=0.0)) for _k, _g, want in pairs]
    floor = NEAR_ZERO * float(np.median(scales)) if scales else 0.0
    for (key, grad, want), own in zip(pairs, scales, strict=True):
        scale = max(own, floor)
        off = float(np.abs(np.asarray(grad, dtype=np.float64) - want).max(initial=0.0))
        if scale > 0 and off > _NOT_ROUNDING * scale:
            marks[custom_backward_key(key[len(grad_key("")) :])] = np.array([off, scale])
    if marks:
        logger.warning(
            "tracelog: the gradients of %s came through the backward of custom autograd "
            "Function(s) %s, which is not the derivative of their recorded forward: the "
            "emitted programs differentiate the forward, and every parity check fails on them",
            ", ".join(k.split("/", 1)[1] for k in sorted(marks)),
            ", ".join(functions),
        )
    return marks


def _flush_at_exit(ref: weakref.ref[ListenerBase]) -> None:
    """atexit: a listener still open leaves its log, marked interrupted."""
    listener = ref()
    if listener is not None and not listener.closed:
        listener.abandon()
