"""Following ``tf.function``s and the backward pass inside a batch window.

The op callback sees a traced function's ops only while it is traced (as
graph ops, with no values), then one op per call. So while a window is open
on a thread, ``tf.function``'s ``__call__`` and ``GradientTape.gradient`` are
hooked (class-level wrappers, installed while a TFListener lives, that do
nothing but call through when no window is open on the thread):

- a step: a function called before the model that captures the model's
  variables (``with listener.batch(): train_step(x, y)``); one that captures
  none is data preparation, run as it is. The first batch of each trace (each concrete function)
  is replayed eagerly under the window, every variable the trace captures
  (model, optimizer, metrics, seed generators) is put back, and then the real
  call runs unwatched: training computes what it would without the listener.
  Later batches of that trace are counted against what the replay counted.
  ``jit_compile=True`` steps are counted unrecorded (XLA, not the eager ops,
  computes them, and no replay can show what it computes).
- a helper: a function the forward calls (Keras' grouped convolution,
  ``_conv_xla``; a user's ``@tf.function`` block). It is run eagerly on the
  side first (recorded, its variables put back), then for real, unwatched;
  the real outputs stand for the side run's recorded ones.
- ``GradientTape.gradient``: its ops are the backward pass, and every op after
  it in the window (the optimizer's) belongs to neither graph.

While a replay runs, ``tf.config.run_functions_eagerly`` is on (process-wide,
for the replay's length) so nested functions run op by op.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

JIT_STEP_REASON = (
    "a jit_compile=True tf.function step: XLA computes it, not the ops an eager "
    "replay would record; compile with jit_compile=False to record it"
)

_tls = threading.local()
_lock = threading.Lock()
_installs = 0
_originals: dict[str, Any] = {}


def _stack() -> list[Any]:
    stack = getattr(_tls, "windows", None)
    if stack is None:
        stack = _tls.windows = []
    return stack


# windows open in any thread: MirroredStrategy's eager replica threads carry
# the op callbacks of the thread that started them, not its thread-locals
_opened: list[Any] = []


def push(w: Any) -> None:
    _stack().append(w)
    with _lock:
        _opened.append(w)


def pop(w: Any) -> None:
    stack = _stack()
    if stack and stack[-1] is w:
        stack.pop()
    with _lock:
        if w in _opened:
            _opened.remove(w)


def active() -> Any:
    stack = getattr(_tls, "windows", None)
    if stack:
        return stack[-1]
    if _opened and in_replica_thread():
        return _opened[-1]
    return None


def in_replica_thread() -> bool:
    try:
        from tensorflow.python.distribute import mirrored_run
    except ImportError:  # pragma: no cover
        return False
    thread_type = getattr(mirrored_run, "_MirroredReplicaThread", None)
    return thread_type is not None and isinstance(threading.current_thread(), thread_type)


def is_function_call(op_type: str) -> bool:
    """An eager op that is the call of a traced function (its op type is the
    function's name)."""
    from tensorflow.python.eager import context

    return op_type.startswith("__inference_") or context.context().has_function(op_type)


@contextlib.contextmanager
def functions_eagerly() -> Iterator[None]:
    from tensorflow.python.eager.polymorphic_function import eager_function_run

    before = eager_function_run.RUN_FUNCTIONS_EAGERLY
    eager_function_run.RUN_FUNCTIONS_EAGERLY = True
    try:
        yield
    finally:
        eager_function_run.RUN_FUNCTIONS_EAGERLY = before


def running_eagerly() -> bool:
    from tensorflow.python.eager.polymorphic_function import eager_function_run

    return bool(eager_function_run.RUN_FUNCTIONS_EAGERLY)


def install() -> None:
    """Hook tf.function calls and GradientTape.gradient (once per process while
    any listener lives)."""
    global _installs
    from tensorflow.python.eager import backprop
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    with _lock:
        _installs += 1
        if _installs > 1:
            return
        call = _originals["call"] = polymorphic_function.Function.__call__
        gradient = _originals["gradient"] = backprop.GradientTape.gradient

        def hooked_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
            w = active()
            if w is None or running_eagerly():
                return call(fn, *args, **kwargs)
            if not w.recording or w.suspended or w.done:
                # not the batch's graphs: nor the sample's tape (under a tape a
                # function is traced and run otherwise)
                with _tape_paused(w):
                    return call(fn, *args, **kwargs)
            if getattr(w, "fast", False):  # a window counted by guards (guards.py)
                return w.listener._fast_function(w, call, fn, args, kwargs)
            return follow(w, call, fn, args, kwargs)

        def hooked_gradient(tape: Any, *args: Any, **kwargs: Any) -> Any:
            w = active()
            if w is None:
                return gradient(tape, *args, **kwargs)
            # the sample's tape must not see the backward: under a tape, some
            # gradients are taken otherwise
            with w.suspend(), _tape_paused(w):
                out = gradient(tape, *args, **kwargs)
            if w.root_calls:  # the backward of the model's loss: a training batch
                w.phase = "train"
                w.done = True  # what follows (the optimizer) is in neither graph
            return out

        polymorphic_function.Function.__call__ = hooked_call
        backprop.GradientTape.gradient = hooked_gradient


def uninstall() -> None:
    global _installs
    from tensorflow.python.eager import backprop
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    with _lock:
        _installs -= 1
        if _installs > 0 or not _originals:
            return
        polymorphic_function.Function.__call__ = _originals.pop("call")
        backprop.GradientTape.gradient = _originals.pop("gradient")


class _Saved:
    """What a replay may change, as it was: every variable the trace captures
    (a read holds the buffer: TensorFlow copies before updating a buffer still
    referenced) and the eager context's op-seed generator (an eager random op
    without an op seed draws one from it)."""

    def __init__(self, w: Any, concrete: Any) -> None:
        from tensorflow.python.eager import context

        seen: set[int] = set()
        self.values: list[tuple[Any, Any]] = []
        with w.suspend():
            for v in concrete.graph.variables:
                if id(v) in seen:
                    continue
                seen.add(id(v))
                self.values.append((v, v.read_value()))
        self.rng = getattr(context.context(), "_rng", None)
        self.rng_state = self.rng.getstate() if self.rng is not None else None

    def restore(self, w: Any) -> None:
        with w.suspend():
            for v, value in self.values:
                v.assign(value)
        if self.rng is not None:
            self.rng.setstate(self.rng_state)


def is_training_step(concrete: Any) -> bool:
    """Does the traced step take a gradient or apply one (TensorFlow names a
    tape's gradient ops under ``gradient_tape/``)?"""
    for op in concrete.graph.get_operations():
        if op.name.startswith("gradient_tape/") or op.type.startswith("ResourceApply"):
            return True
    return False


@contextlib.contextmanager
def _unwatched(w: Any) -> Iterator[None]:
    """Neither the window nor the sample's tape sees this: a tf.function traced
    or called under a tape is traced and run otherwise (a forward function
    that keeps intermediates), which can change its numerics."""
    with w.suspend(), _tape_paused(w):
        yield


@contextlib.contextmanager
def _tape_paused(w: Any) -> Iterator[None]:
    """The sample's GradientTape stops recording (once, however nested)."""
    private = w.private_tape
    if private is None or w.tape_paused:
        yield
        return
    w.tape_paused = True
    try:
        with private.stop_recording():
            yield
    finally:
        w.tape_paused = False


def follow(w: Any, call: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
    if w.root_calls == 0 and w.step_key is None:
        return _step(w, call, fn, args, kwargs)
    return _helper(w, call, fn, args, kwargs)


def captures_model(listener: Any, concrete: Any) -> bool:
    """Does the traced function capture a variable of the listener's model
    (for a distributed variable, any of its replicas')?"""
    model = set()
    for v in listener._variables.values():
        tf_var = v.value
        model.add(id(tf_var))
        model.update(id(c) for c in getattr(tf_var, "values", ()) or ())
    return any(id(v) in model for v in concrete.graph.variables)


def _step(w: Any, call: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
    listener = w.listener
    try:
        with _unwatched(w):
            concrete = fn.get_concrete_function(*args, **kwargs)
        key = str(concrete.name)
        uses_model = captures_model(listener, concrete)
        if uses_model and getattr(fn, "_jit_compile", None):
            w.phase = "train" if is_training_step(concrete) else "eval"
            w.stop(JIT_STEP_REASON)
        saved = _Saved(w, concrete) if uses_model and w.recording else None
    except Exception as e:  # fail open: the real call below still runs
        w.fail(e)
        uses_model = True
    if not w.recording:
        with _unwatched(w):
            return call(fn, *args, **kwargs)
    if not uses_model:
        # data preparation before the model (a tf.function that touches none
        # of its variables): its outputs reach the model as data
        with _unwatched(w):
            return call(fn, *args, **kwargs)
    known = listener._steps.get(key)
    if known is not None:  # a later batch of a replayed trace: counted alike
        w.phase = known[0]
        w.counted_as = known
        with _unwatched(w):
            return call(fn, *args, **kwargs)
    w.step_key = key
    assert saved is not None
    try:
        with functions_eagerly():
            call(fn, *args, **kwargs)
    except Exception as e:
        if w.recording:
            if w.phase != "train" and is_training_step(concrete):
                w.phase = "train"
            w.stop(f"the eager replay of the tf.function step raised {type(e).__name__}: {e}"[:300])
            if listener.strict:
                raise
    finally:
        saved.restore(w)
        w.done = True  # the window's step ran; the real call is not watched
    with _unwatched(w):
        return call(fn, *args, **kwargs)


def _helper(w: Any, call: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
    import tensorflow as tf

    try:
        with w.suspend():
            concrete = fn.get_concrete_function(*args, **kwargs)
        saved = _Saved(w, concrete)
    except Exception as e:  # fail open
        w.fail(e)
        return call(fn, *args, **kwargs)
    side = None
    w.side += 1  # the side run's ops and layer calls are not in the batch's key
    try:
        with functions_eagerly():
            side = call(fn, *args, **kwargs)
    except Exception as e:
        w.fail(e)
    finally:
        w.side -= 1
        saved.restore(w)
    with w.suspend():
        out = call(fn, *args, **kwargs)
    if side is not None and w.recording:
        real, ran = tf.nest.flatten(out), tf.nest.flatten(side)
        for a, b in zip(real, ran, strict=True):
            ref = w.refs.get(id(b))
            if ref is not None:
                w.refs[id(a)] = ref
                w.keep.append(a)
    return out
