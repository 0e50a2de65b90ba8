"""The guarded fast path, TensorFlow side: a batch's key read without the op callback.

The key (``tracelog.adapters.guards``) is ``(static, inputs, calls)``:

- ``static``, read as the window opens: every layer (by identity) with its
  ``trainable`` flag and dtype policy, every variable (path, shape, dtype,
  ``trainable``), ``floatx`` and the global dtype policy (mixed precision).
  A layer or variable added to the model changes it;
- ``inputs``, read as the root's ``call`` starts: what it receives, tensors
  and arrays by shape and dtype, plain values (``training``) as they are;
- ``calls``, from the forward's start to ``GradientTape.gradient``: each
  layer call (its path: the listener wraps every layer's ``call`` anyway)
  and, once the forward returned, each eager op (type, input shapes and
  dtypes) from a light op callback that lives only until the gradient: the
  loss, its targets' shapes and dtypes, a branch that calls other layers or
  computes another loss.

The forward, the backward and the optimizer run with no op callback at all.
A branch inside a layer's arithmetic (other ops, the same layers) is not
seen: the periodic exact recording is (``tracelog.adapters.guards``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator, Mapping
from typing import Any

from tracelog.adapters.guards import Streak

_PLAIN = (bool, int, float, str, bytes)


def _sig(a: Any) -> Any:
    """An argument as the key sees it: a tensor or array by shape and dtype."""
    if a is None or isinstance(a, _PLAIN):
        return a
    shape = getattr(a, "shape", None)
    dtype = getattr(a, "dtype", None)
    if shape is not None and dtype is not None:
        return (type(a).__name__, tuple(shape), str(dtype))
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_sig(x) for x in a))
    if isinstance(a, Mapping):
        return (type(a).__name__, tuple((k, _sig(v)) for k, v in a.items()))
    return type(a).__name__


def input_key(args: Any, kwargs: Any) -> Hashable:
    """What the root's ``call`` receives (``training`` among the plain values)."""
    return (_sig(tuple(args)), _sig(dict(kwargs)))


def op_key(op_type: Any, inputs: Any) -> Hashable:
    """An eager op of the loss as the key sees it."""
    return (op_type, tuple([(tuple(t.shape), t.dtype) for t in inputs]))


def static_key(model: Any) -> tuple[Hashable, list[Any], list[Any]]:
    """The model's facts that decide a batch's graphs, read as the window
    opens; with the layers and variables read for it."""
    import keras

    layers = list(model._flatten_layers(include_self=True, recursive=True))
    variables = list(model.variables)
    key = (
        tuple([(id(x), x.trainable, _policy(x)) for x in layers]),
        tuple([(v.path, tuple(v.shape), v.dtype, v.trainable) for v in variables]),
        keras.config.floatx(),
        keras.config.dtype_policy().name,
    )
    return key, layers, variables


def _policy(layer: Any) -> Any:
    policy = getattr(layer, "dtype_policy", None)
    return getattr(policy, "name", None)


class FastWindow:
    """A batch window counted by guards: no op callback in the forward or the
    backward, no tape; it follows the root's calls and reads the key. It has
    what ``functions.py``'s hooks read of a window."""

    fast = True
    private_tape = None
    step_key = None
    counted_as = None
    before = None

    def __init__(self, listener: Any, epoch: int, static: Hashable) -> None:
        self.listener = listener
        # the phase is the root call's ``training`` argument (or a gradient taken)
        self.phase, self.epoch, self.batch = "eval", epoch, -1
        self.static = static
        self.inputs: Hashable = None
        self.streak: Streak | None = None  # the trusted key it is counted by, from its forward
        self.calls: list[Hashable] | None = None
        self.recording = True
        self.error: str | None = None
        self.root_depth = 0
        self.root_calls = 0
        self.root_done = False
        self.key_started = False
        self.suspended = 0
        self.side = 0
        self.tape_paused = False
        self._done = False
        self._watching = False

    # -- as functions.py sees a window ---------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done

    @done.setter
    def done(self, value: bool) -> None:
        """The gradient was taken: the key's calls end (the optimizer is in neither graph)."""
        self._done = value
        if value:
            self.unwatch()

    @contextlib.contextmanager
    def suspend(self) -> Iterator[None]:
        """Ops run inside are not the batch's (the backward: no callback at all)."""
        self.suspended += 1
        self.unwatch()
        try:
            yield
        finally:
            self.suspended -= 1
            if not self.suspended and self.root_done and not self._done:
                self.watch()

    def stop(self, reason: str) -> None:
        self.recording = False
        self.error = reason

    def fail(self, e: BaseException) -> None:
        if self.listener.strict:
            raise e
        from tracelog.adapters.base import describe

        self.stop(describe(e))

    # -- the root's call -------------------------------------------------------------------
    def run(self, original: Any, is_root: bool, args: tuple, kwargs: dict) -> Any:
        """A layer's call, unwatched; the root's first call sets the phase, and
        its end starts the light callback of the loss."""
        if not is_root:
            return original(*args, **kwargs)
        if self.root_depth == 0:
            self.root_calls += 1
            if self.root_calls == 1:
                self.phase = "train" if kwargs.get("training") else "eval"
        self.root_depth += 1
        try:
            out = original(*args, **kwargs)
        finally:
            self.root_depth -= 1
        if self.root_depth == 0 and self.root_calls == 1 and not self.root_done:
            self.root_done = True
            if not self._done and not self.suspended:
                self.watch()
        return out

    # -- the loss's ops ------------------------------------------------------------------
    def _on_op(
        self,
        op_type: Any,
        inputs: Any,
        attrs: Any,
        outputs: Any,
        op_name: Any = None,
        graph: Any = None,
    ) -> None:
        if graph is None and self.calls is not None and not self.suspended and not self.side:
            try:
                self.calls.append(op_key(op_type, inputs))
            except Exception as e:  # fail open: training goes on, the batch is unrecorded
                self.fail(e)
        return None

    def watch(self) -> None:
        if not self._watching and self.calls is not None:
            self.listener._op_callbacks.add_op_callback(self._on_op)
            self._watching = True

    def unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self.listener._op_callbacks.remove_op_callback(self._on_op)

    # -- the key ---------------------------------------------------------------------------
    def mark_loss(self, t: Any) -> None:
        if self.calls is not None:
            self.calls.append(("loss()",))

    def note_loss(self, loss: Any) -> None:
        return None

    def key(self) -> tuple[Hashable, ...]:
        calls = tuple(self.calls) if self.calls is not None else ()
        return (self.static, self.inputs, calls)


__all__ = ["FastWindow", "input_key", "op_key", "static_key"]
