"""The guarded fast path, PyTorch side: a batch's key read without the recorder.

The key (``tracelog.adapters.guards``) is ``(static, inputs, calls)``:

- ``static``, read as the window opens: every module's training flag, each
  parameter's ``requires_grad``, a version of the module tree (it moves when
  a parameter or a submodule is registered on one of the model's modules:
  added or replaced), the default dtype, deterministic algorithms;
- ``inputs``, read as the root's forward starts: grad mode, inference mode,
  autocast (CPU and CUDA, enabled and dtype), and the shapes, dtypes and
  devices (and plain values) of what the forward receives;
- ``calls``, from the forward's start to the first backward: each module
  call (its path, from the hooks the recorder has anyway), then the loss.
  Where the forward's output requires grad (training), the loss is read as
  its backward starts, from the autograd graph between the loss and that
  output: each node's kind and its saved plain values (reduction, dims,
  sizes, scalars such as a label-smoothing factor). ``torch.autograd.
  backward`` and ``grad`` are wrapped once per process for that; the wrapper
  does nothing outside a window's loss. No Python runs per loss function
  call. Elsewhere (eval, no grad, a trainer's step) each torch function call
  once the forward returned is noted (a ``TorchFunctionMode``: one Python
  call per function, not per aten op), with its tensor arguments' shapes and
  dtypes and its plain arguments. Either way the key sees the loss function
  and its options, and a branch that calls other modules or loss functions.
  Not inside the forward: a TorchFunctionMode on the stack turns off fused
  fast paths (``has_torch_function``: attention in inference), so it would
  change what runs.

A parameter replaced shows in the tree version. A branch inside a module's
arithmetic (other functions, the same modules) is not seen: the periodic
exact recording is.
"""

from __future__ import annotations

import functools
import operator
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from tracelog.adapters.guards import Streak

from .compiled import compiling

_PLAIN = (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
# what ends the calls the key reads: backward and the optimizer are in neither graph
_BACKWARD = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)


def _sig(a: Any) -> Any:
    """An argument as the key sees it: a tensor by shape and dtype."""
    if isinstance(a, torch.Tensor):
        return (a.shape, a.dtype)
    if a is None or isinstance(a, _PLAIN):
        return a
    if isinstance(a, (list, tuple)):
        return tuple([_sig(x) for x in a])
    return type(a)


def _sigs(args: Any) -> tuple[Any, ...]:
    """_sig of each argument; tensors and plain values without a call (every
    torch function call after a fast window's forward reads these)."""
    return tuple(
        [
            (
                (a.shape, a.dtype)
                if isinstance(a, torch.Tensor)
                else a if a is None or isinstance(a, _PLAIN) else _sig(a)
            )
            for a in args
        ]
    )


def _one_input(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return (a.shape, a.dtype, a.device, a.requires_grad)
    if a is None or isinstance(a, _PLAIN):
        return a
    if isinstance(a, (list, tuple)):
        return (type(a), tuple([_one_input(x) for x in a]))
    if isinstance(a, Mapping):
        return (type(a), tuple([(k, _one_input(v)) for k, v in a.items()]))
    return type(a)


def input_key(args: Any, kwargs: Any) -> Hashable:
    """What the root's forward receives: tensors by shape, dtype, device and
    ``requires_grad``, containers walked, plain values as they are."""
    # the same key as _one_input((args, kwargs)) gives, read with fewer calls
    # for the usual forward (one tensor, positional)
    if len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor):
        a = args[0]
        return ((tuple, ((a.shape, a.dtype, a.device, a.requires_grad),)), (dict, ()))
    pos = (tuple, tuple([_one_input(a) for a in args]))
    return (pos, _one_input(kwargs) if kwargs else (dict, ()))


# -- the loss read from its autograd graph as backward starts ------------------------------
# .calls: the Calls waiting for this thread's backward; .recorder: what an exact
# window's recorder does as this thread's backward starts (listener.py)
_READING = threading.local()
_WRAPPED: dict[str, Callable[..., Any]] = {}  # torch.autograd's functions, as they were
# per autograd node class: its saved plain values' names, and one getter of all of
# them (an attrgetter: of one name, it returns the value itself)
_PLAIN_SAVED: dict[type, tuple[tuple[str, ...], Callable[[Any], Any] | None]] = {}
_LOSS_NODES = 256  # a loss graph read no further (one that never meets the forward's output)


_SCALARS = frozenset([bool, int, float, str, type(None)])


def _plain(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, (tuple, list)) and all(isinstance(x, (bool, int, float)) for x in v)


def _saved(node: Any, cls: type) -> tuple[Any, ...]:
    """The node's saved plain values (``_saved_reduction``, ``_saved_dim``,
    ``_saved_other`` of a scalar...); which attributes those are is found once
    per node class. A value that is not plain reads as its type's name, one
    that cannot be read (a custom Function's) as "?"."""
    found = _PLAIN_SAVED.get(cls)
    if found is None:
        found = _PLAIN_SAVED[cls] = _saved_getter(node)
    names, getter = found
    if getter is None:
        return ()
    try:  # every batch's loss reads these: one C call where each is a scalar, as usual
        values = getter(node)
    except Exception:
        return tuple([_read(node, a) for a in names])
    if len(names) == 1:
        values = (values,)
    if _SCALARS.issuperset(map(type, values)):
        return values
    return tuple([_read(node, a) for a in names])


def _saved_getter(node: Any) -> tuple[tuple[str, ...], Callable[[Any], Any] | None]:
    """A node class's saved plain values: their names, and a getter of them
    (None: the class saves none)."""
    names = tuple(a for a in dir(node) if a.startswith("_saved_") and _plain_attr(node, a))
    if not names:
        return names, None
    return names, operator.attrgetter(*names)


def _plain_attr(node: Any, attr: str) -> bool:
    try:
        return _plain(getattr(node, attr))
    except Exception:  # a saved value gone, or a custom Function's that cannot be read
        return False


def _read(node: Any, attr: str) -> Any:
    """A saved plain value; a tensor saved where a plain value was before (an
    optional weight) by its type's name, so the key stays hashable."""
    try:
        v = getattr(node, attr)
    except Exception:
        return "?"
    return v if _plain(v) else type(v).__name__


def loss_graph(roots: Any, stop: frozenset[int]) -> tuple[Any, ...]:
    """The autograd graph from `roots` (the loss) down to the nodes in `stop`
    (the forward output's grad_fns) and the leaves: each node's kind and saved
    plain values, depth first, at most _LOSS_NODES nodes. (Read on every
    guarded batch: loops rather than comprehensions, a call each.)"""
    todo = []
    for t in reversed(roots):
        if isinstance(t, torch.Tensor):
            todo.append(t.grad_fn)
    seen: set[int] = set()
    nodes: list[Any] = []
    while todo:
        node = todo.pop()
        if node is None:
            continue
        i = id(node)
        if i in seen:
            continue
        seen.add(i)
        if i in stop:
            nodes.append("output")
            continue
        if len(nodes) == _LOSS_NODES:
            nodes.append("...")
            break
        cls = type(node)  # its kind: the class, not name()'s new string
        nodes.append((cls, _saved(node, cls)))
        for fn, _ in reversed(node.next_functions):
            todo.append(fn)
    return tuple(nodes)


def _wrap_autograd() -> None:
    """Wrap torch.autograd.backward (Tensor.backward calls it) and grad, once:
    each tells the Calls reading this thread's loss, if any, before it runs."""
    if _WRAPPED:
        return
    backward, grad = torch.autograd.backward, torch.autograd.grad
    _WRAPPED.update(backward=backward, grad=grad)
    torch.autograd.backward = _traced(backward, "tensors")
    torch.autograd.grad = _traced(grad, "outputs")


def _traced(run: Callable[..., Any], first: str) -> Callable[..., Any]:
    """`run` (backward or grad), telling this thread's pending loss read first;
    its roots passed by position or by their name (`first`), as torch's take them."""

    @functools.wraps(run)
    def traced(*args: Any, **kwargs: Any) -> Any:
        calls = getattr(_READING, "calls", None)
        if calls is not None and not calls.listener.busy:  # not the listener's own autograd
            roots = args[0] if args else kwargs.get(first)
            if roots is not None:
                _READING.calls = None
                calls.backward((roots,) if isinstance(roots, torch.Tensor) else tuple(roots))
        recorder = getattr(_READING, "recorder", None)
        if recorder is not None:
            roots = args[0] if args else kwargs.get(first)
            if roots is not None:
                recorder(roots)
        return run(*args, **kwargs)

    return traced


class Calls(TorchFunctionMode):
    """Notes each torch function call of a window (its ``calls`` key part)
    from the forward's start to the first backward; pushed at the forward's
    start, popped at the window's end."""

    def __init__(self, listener: Any, window: Any) -> None:
        super().__init__()
        self.listener = listener
        self.window = window
        self.calls: list[Hashable] = []
        self.on = True  # off after the first backward, and once the window ended
        self.started = False
        self.pushed = False  # on the torch function stack (not reading the autograd graph)
        # the forward output's grad_fns, held (a node's Python object keeps its id while
        # alive) until the loss graph is read
        self.outputs: tuple[Any, ...] = ()

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        if self.on and not self.listener.busy and not compiling():
            self.calls.append(
                (
                    func,
                    _sigs(args),
                    tuple(zip(kwargs, _sigs(kwargs.values()), strict=True)) if kwargs else (),
                )
            )
            out = func(*args, **kwargs)
            if func in _BACKWARD:
                self.on = False
                self.window.saw_backward = True  # exact windows set it already
            return out
        return func(*args, **kwargs)

    def start(self, outputs: tuple[Any, ...] = ()) -> None:
        """The forward returned. With `outputs` (the grad_fns of its output
        tensors), the loss is read from the autograd graph as backward starts;
        without, each function call is noted from now."""
        self.started = True
        if outputs:
            if not _WRAPPED:
                _wrap_autograd()
            self.outputs = outputs
            _READING.calls = self
            return
        self.pushed = True
        torch._C._push_on_torch_function_stack(self)  # what __enter__ does, less two frames

    def backward(self, roots: tuple[Any, ...]) -> None:
        """Backward starts on `roots`: the loss's graph is the key's last part
        (read fail-open, as the window does its own work: an error stops the
        window's recording, never the user's backward)."""
        w = self.window
        if not self.on or w is None:
            return
        self.on = False
        w.saw_backward = True
        if w.recording:  # read fail-open, as w.guarded would (inlined: every batch)
            try:
                stop = frozenset(map(id, self.outputs))
                self.calls.append(("backward", loss_graph(roots, stop)))
            except Exception as e:
                w.fail(e)
        self.outputs = ()

    def end(self) -> None:
        """Leave the stack if on top; else (a mode pushed after it and still
        there) stay, switched off: never pop another's mode. It lets go of its
        window: the two refer to each other, a cycle only a garbage
        collection would free otherwise."""
        self.on = False
        self.window = None
        self.outputs = ()
        if getattr(_READING, "calls", None) is self:
            _READING.calls = None
        if self.pushed:
            n = torch._C._len_torch_function_stack()
            if n and torch._C._get_function_stack_at(n - 1) is self:
                torch._C._pop_torch_function_stack()  # __exit__'s work


class FastWindow:
    """A batch window counted by guards: no recorder, no tape; it follows the
    root's calls (for micro-batches and the forward's start) and reads the key.
    Slotted: one is made every guarded batch."""

    __slots__ = (
        "listener",
        "phase",
        "epoch",
        "batch",
        "streak",
        "static",
        "inputs",
        "calls",
        "recording",
        "error",
        "root_depth",
        "root_calls",
        "root_done",
        "key_started",
        "saw_backward",
        "step",
    )
    local_grads = None
    before = None

    def __init__(self, listener: Any, phase: str, epoch: int, batch: int, static: Hashable) -> None:
        self.listener = listener
        self.step = False
        self.phase, self.epoch, self.batch = phase, epoch, batch
        self.streak: Streak | None = None  # the trusted key it is counted by, from its forward
        self.static = static
        self.inputs: Hashable = None
        self.calls: Calls | None = None
        self.recording = True
        self.error: str | None = None
        self.root_depth = 0
        self.root_calls = 0
        self.root_done = False
        self.key_started = False
        self.saw_backward = False

    def stop(self, reason: str) -> None:
        self.recording = False
        self.error = reason

    def fail(self, e: BaseException) -> None:
        if self.listener.strict:
            raise e
        from tracelog.adapters.base import describe

        self.stop(describe(e))

    def guarded(self, fn: Any, *args: Any) -> None:
        if not self.recording:
            return
        self.listener.busy += 1
        try:
            fn(*args)
        except Exception as e:  # fail open, as an exact window does
            self.fail(e)
        finally:
            self.listener.busy -= 1

    def enter_root(self) -> None:
        if self.root_depth == 0:
            self.root_calls += 1
        self.root_depth += 1

    def exit_root(self) -> None:
        self.root_depth -= 1
        if self.root_depth == 0 and self.root_calls == 1:
            self.root_done = True

    def start_step(self, batch: Any) -> None:
        """A trainer's step: the step is the root's call (as an exact window)."""
        self.step = True
        w = self.listener._forward_starts(self, (batch,), {})
        if w is not self:
            w.start_step(batch)
            return
        self.enter_root()

    def end_step(self) -> None:
        if self.step and self.root_depth == 1 and not self.root_done:
            self.exit_root()
            self.listener._forward_ended(self)

    def mark_loss(self, t: Any) -> None:
        if self.calls is not None:
            self.calls.calls.append(("loss()",))

    def key(self) -> tuple[Hashable, ...]:
        calls = tuple(self.calls.calls) if self.calls is not None else ()
        return (self.static, self.inputs, calls)


def _passes_through(module: torch.nn.Module) -> bool:
    """Does calling `module` call each of its children once, in order, and
    nothing else (torch's ``nn.Sequential.forward``, not overridden)?"""
    if not isinstance(module, torch.nn.Sequential) or "forward" in vars(module):
        return False
    cls = type(module)
    return (
        cls.forward is torch.nn.Sequential.forward
        and cls.__iter__ is torch.nn.Sequential.__iter__
        and cls.__call__ is torch.nn.Module.__call__
        and cls._call_impl is torch.nn.Module._call_impl
    )


def implied_calls(root: torch.nn.Module) -> set[int]:
    """The modules (by id) whose calls the root's call implies: reached from
    an ``nn.Sequential`` root only through ``nn.Sequential``s, each held by no
    other module. Inside the root's forward only those Sequentials' loops call
    them, once each, in order, and the key's module calls need not note them.
    (A call from outside the root's forward, in the window, is in the loss's
    autograd graph or the function calls the key reads there.)"""
    parents: dict[int, list[torch.nn.Module]] = {}
    for module in root.modules():
        for child in module._modules.values():
            if child is not None:
                parents.setdefault(id(child), []).append(module)
    pure: dict[int, bool] = {}  # passes through, and is reached only through such

    def is_pure(module: torch.nn.Module) -> bool:
        found = pure.get(id(module))
        if found is None:
            pure[id(module)] = False  # a cycle in the tree: not pure
            found = _passes_through(module) and (
                module is root or all(is_pure(p) for p in parents.get(id(module), []))
            )
            pure[id(module)] = found
        return found

    if not is_pure(root):
        return set()
    return {
        id(m)
        for m in root.modules()
        if m is not root and all(is_pure(p) for p in parents.get(id(m), []))
    }


def on_backward(recorder: Callable[[Any], None] | None) -> None:
    """What this thread's next backward (``torch.autograd.backward``, ``grad``)
    tells first, with its roots: an exact window's recorder (None: nothing)."""
    if recorder is not None:
        _wrap_autograd()
    _READING.recorder = recorder


__all__ = ["Calls", "FastWindow", "implied_calls", "input_key", "on_backward"]
