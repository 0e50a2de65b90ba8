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
  call (its path, from the hooks the recorder has anyway) and,
  once the forward returned, each torch function call (a
  ``TorchFunctionMode``: one Python call per function, not per aten op, and
  none inside backward), with its tensor arguments' shapes and dtypes and its
  plain arguments. That sees the loss's inputs (targets' shapes and dtypes),
  the loss function and its options, and a branch that calls other modules
  or loss functions. Not inside the forward: a TorchFunctionMode on the
  stack turns off fused fast paths (``has_torch_function``: attention in
  inference), so it would change what runs.

A parameter replaced shows in the tree version. A branch inside a module's
arithmetic (other functions, the same modules) is not seen: the periodic
exact recording is.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
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
    # for the usual forward (positional arguments only)
    pos = (tuple, tuple([_one_input(a) for a in args]))
    return (pos, _one_input(kwargs) if kwargs else (dict, ()))


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

    def start(self) -> None:
        self.started = True
        torch._C._push_on_torch_function_stack(self)  # what __enter__ does, less two frames

    def end(self) -> None:
        """Leave the stack if on top; else (a mode pushed after it and still
        there) stay, switched off: never pop another's mode. It lets go of its
        window: the two refer to each other, a cycle only a garbage
        collection would free otherwise."""
        self.on = False
        self.window = None
        n = torch._C._len_torch_function_stack()
        if self.started and n and torch._C._get_function_stack_at(n - 1) is self:
            torch._C._pop_torch_function_stack()  # __exit__'s work


class FastWindow:
    """A batch window counted by guards: no recorder, no tape; it follows the
    root's calls (for micro-batches and the forward's start) and reads the key."""

    step = False
    local_grads = None
    before = None

    def __init__(self, listener: Any, phase: str, epoch: int, batch: int, static: Hashable) -> None:
        self.listener = listener
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


__all__ = ["Calls", "FastWindow", "input_key"]
