"""The PyTorch listener: a TorchDispatchMode active only inside batch windows.

Rules it keeps (DESIGN.md): it never perturbs training (no RNG draws, no
syncs, no changed numerics: every op runs exactly as it would without it),
it fails open (an error while recording drops that batch's record, counts it
as unrecorded and lets training go on), and after warm-up a batch costs a
fingerprint of its light tape; IR is built only for unseen fingerprints.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import operator
import os
import platform
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.nn.modules.module import (
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode

from tracelog.adapters.base import ListenerBase, StateBefore, WindowBase, describe
from tracelog.adapters.builder import Draws, NotSupported, written_in_place
from tracelog.adapters.guards import GuardBook, GuardedCounting
from tracelog.adapters.tape import Ref, Tape, TArg, concrete_shape, symbolic_shape
from tracelog.ir import Graph
from tracelog.log import TraceLog

from .batch_dims import SELECTS, exact_batch_dims, selection_axis
from .compiled import (
    COMPILED_REASON,
    COMPILED_WARNING,
    MAYBE_COMPILED,
    compiling,
    dynamo_compiled_something,
    unwrap_compiled,
)
from .distributed import LocalGrads, Ranks, facts_for_log, placement, unwrap, world
from .guards import Calls, FastWindow, implied_calls, input_key, on_backward
from .recurrent import InnerOps, RecurrentScopes, wrap_pad_packed
from .reference import forward64
from .rules import ATEN, DRAW_OPS, RESTRIDE, VIEW_WRITE, WHOLE_VIEWS
from .rules_attention import TOPK, topk_args, topk_keys
from .rules_math import RRELU, rrelu_draws
from .tensors import (
    _DTYPES,
    TORCH_DTYPES,
    dtype_name,
    flatten_tensors,
    tensor_digest,
    to_array,
    to_numpy,
)

logger = logging.getLogger("tracelog")

# views whose writes reach their base (a VIEW_WRITE record, rules.py): a region
# (slice, select), or the whole base in another shape or order (nn.Dropout(inplace)
# on a flattened pool output, a write into a transposed view)
_VIEW_OPS = {"aten.slice.Tensor", "aten.select.int", *WHOLE_VIEWS}


class _OpInfo(NamedTuple):
    """What the recorder reads of an op's schema, read once per op overload
    (one dict lookup per op: an OpOverload's hash is a Python call)."""

    name: str
    mutated: tuple[int, ...]  # positional args it writes to without returning them
    writes_self: bool  # it writes into its first argument (copy_, fill_, add_, ...)
    batch_norm: bool  # native_batch_norm: it writes its running statistics (_mutated_args)


_OPS: dict[Any, _OpInfo] = {}


def _op_info(func: Any) -> _OpInfo:
    info = _OPS.get(func)
    if info is None:
        info = _OPS[func] = _read_op(func)
    return info


def _read_op(func: Any) -> _OpInfo:
    name = f"aten.{func.__name__}" if func.namespace == "aten" else str(func)
    schema = func._schema
    returned = {
        s for r in schema.returns if r.alias_info is not None for s in r.alias_info.after_set
    }
    found = []
    for i, a in enumerate(schema.arguments):
        alias = a.alias_info
        if alias is not None and alias.is_write and not a.kwarg_only:
            if not (set(alias.after_set) & returned):
                found.append(i)
    first = schema.arguments[0].alias_info if schema.arguments else None
    return _OpInfo(
        name,
        tuple(found),
        bool(first is not None and first.is_write),
        func is torch.ops.aten.native_batch_norm.default,
    )


def _mutated_args(func: Any, info: _OpInfo, args: tuple[Any, ...]) -> tuple[int, ...]:
    """Positional args an op writes to without returning them."""
    # native_batch_norm updates the running statistics in place, though its
    # schema does not say so.
    if func is torch.ops.aten.native_batch_norm.default and args[5] and args[3] is not None:
        return (3, 4)
    return info.mutated


_RESTRIDES = ("aten.as_strided_.default", "aten.as_strided.default")


def _keeps_values(args: tuple[Any, ...]) -> bool:
    """as_strided(x, size, stride[, offset]) that reads x's own elements in
    x's order: the same sizes, the same offset, and x's stride on every dim
    longer than 1 (a unit dim's stride reads nothing)."""
    x, size, stride = args[0], args[1], args[2]
    offset = args[3] if len(args) > 3 else None
    return (
        isinstance(x, torch.Tensor)
        and list(size) == list(x.shape)
        and (offset is None or offset == x.storage_offset())
        and all(s == t for s, t, n in zip(stride, x.stride(), size, strict=True) if n > 1)
    )


def _restrided(x: torch.Tensor, *_: Any) -> torch.Tensor:
    """A RESTRIDE record replayed (the batch-dim replay, the float64 reference):
    the values are x's."""
    return x


def _stand_in(a: TArg, batch: int) -> torch.Tensor:
    """A tensor of a recorded value's dtype and shape that holds no data (meta):
    what the tape records as an inner view's new value in a chain of writes."""
    return torch.empty(concrete_shape(a.shape, batch), dtype=TORCH_DTYPES[a.dtype], device="meta")


def _view_write_replay(base: torch.Tensor, *_: Any) -> torch.Tensor:
    """A view write on meta tensors (the batch-dim replay): the base's shape."""
    return torch.empty_like(base)


def _grad_fns(output: Any) -> tuple[Any, ...]:
    """The grad_fns of the output's tensors (a tensor, or nested in tuples,
    lists and dicts: a Hugging Face ModelOutput)."""
    if isinstance(output, torch.Tensor):  # the usual forward: one tensor
        return () if output.grad_fn is None else (output.grad_fn,)
    flat: list[tuple[str, torch.Tensor]] = []
    _flatten_tensors(output, "", flat)
    return tuple([t.grad_fn for _, t in flat if t.grad_fn is not None])


def _pre_hook_as_at_attach(
    module: torch.nn.Module, hook: Callable[..., None], before: frozenset[int]
) -> Any:
    """`hook` registered on `module` where a pre hook registered as the
    listener attached stands: after the user's pre hooks that were there then
    (`before`: it sees the arguments they give), before those added since
    (they see the scope it entered, as a recurrent layer's)."""
    handle = module.register_forward_pre_hook(hook)
    hooks = module._forward_pre_hooks  # ordered: prepend=True reorders it so
    for later in [i for i in hooks if i not in before and i != handle.id]:
        hooks[later] = hooks.pop(later)  # to the end, after ours
    return handle


def _flatten_tensors(obj: Any, prefix: str, out: list[tuple[str, torch.Tensor]]) -> None:
    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            _flatten_tensors(v, f"{prefix}.{k}", out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flatten_tensors(v, f"{prefix}.{i}", out)


_TRAINING = operator.attrgetter("training")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


class _Mode(TorchDispatchMode):
    def __init__(self, window: _Window) -> None:
        super().__init__()
        # the window ops go to; None while the listener itself runs torch ops
        # inside a batch (closing one micro-batch and opening the next)
        self.window: _Window | None = window
        # pushed and not popped: it leaves the stack as backward starts
        # (TorchListener._backward_begins), and comes back for a next micro-batch
        self.on_stack = False

    def __enter__(self) -> Any:
        out = super().__enter__()
        self.on_stack = True
        return out

    def __exit__(self, *exc: Any) -> Any:
        self.on_stack = False
        return super().__exit__(*exc)

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Dynamo compiles with this mode on the stack instead of skipping the
        # frame for good (compiled.py); compiled code is not recorded
        return True

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        w = self.window
        if w is None or (w.saw_backward and w.call is None) or not w.recording:
            return out  # backward and after: in neither graph (on_op), no call made
        if not compiling():  # read after: a call per op (Dynamo never traces this mode)
            # w.guarded(w.on_op, ...), inline: this runs for every op of the forward
            listener = w.listener
            listener.busy += 1  # the recorder's own torch calls are not the batch's
            try:
                w.on_op(func, args, kwargs, out)
            except Exception as e:  # fail open: training goes on, the batch is unrecorded
                w.fail(e)
            finally:
                listener.busy -= 1
        return out


def _window_of(mode: Any) -> _Window | None:
    """The exact window a dispatch mode records into, if it is the recorder's."""
    return mode.window if type(mode) is _Mode else None


class _Window(WindowBase):
    """One batch window, as the dispatcher shows it: backward and optimizer
    ops are seen and left out; views, in-place writes and autograd's seed are
    resolved here."""

    listener: TorchListener
    merged_targets = True
    grad_enabled = staticmethod(torch.is_grad_enabled)
    # the user's custom autograd Functions its forward ran (_function_bodies)
    custom_functions: list[str]

    def __init__(self, listener: TorchListener, phase: str, epoch: int, batch: int) -> None:
        super().__init__(listener, phase, epoch, batch)
        self.refs.update(listener._static_refs())
        self.saw_backward = False
        self._arg_tainted = False  # set by _norm for the op being recorded
        self.seed: Ref | None = None
        self.views: dict[int, int] = {}  # id of a view tensor -> the record that made it
        # a random draw's values as drawn, by record (a later in-place op may change
        # the tensor: DropPath floors keep_prob + rand in place)
        self.draws: dict[int, torch.Tensor] = {}
        self.call: InnerOps | None = None  # inside a recurrent call recorded whole
        # a step window (a trainer's training or validation step, start_step):
        # the root's call is the whole step, its predictions the outputs of the
        # step's last top-level call of a module that holds parameters
        self.step = False
        self.step_output: Any = None
        # a distributed sample window: this rank's gradients, before the all-reduce
        self.local_grads: LocalGrads | None = None
        # the guarded fast path's key of this batch (guards.py), read as for a fast window
        self.key_started = False
        self.static: Any = None
        self.inputs: Any = None
        self.calls: Calls | None = None

    def guarded(self, fn: Callable[..., None], *args: Any) -> None:
        if not self.recording:
            return
        listener = self.listener
        listener.busy += 1  # the recorder's own torch calls are not the batch's
        try:
            fn(*args)
        except Exception as e:  # fail open: training goes on, the batch is unrecorded
            self.fail(e)
        finally:
            listener.busy -= 1

    def mark_loss(self, t: Any) -> None:
        super().mark_loss(t)
        if self.calls is not None:
            self.calls.calls.append(("loss()",))  # as a fast window notes it

    def key(self) -> tuple[Any, ...] | None:
        if self.calls is None:
            return None
        return (self.static, self.inputs, tuple(self.calls.calls))

    # -- the root's call ---------------------------------------------------------------
    def start_forward(self, args: Any, kwargs: Any) -> None:
        # the phase is the model's mode when its forward runs (a trainer may
        # switch it to train mode after the window opened): the batch moves
        phase = "train" if self.listener.model.training else "eval"
        if phase != self.phase:
            self.listener._return_batch(self.epoch, self.phase)
            self.phase, self.batch = phase, self.listener._next_batch(phase)
        super().start_forward(args, kwargs)

    def start_step(self, batch: Any) -> None:
        """A trainer's step begins with its batch: the step is the root's call."""
        self.step = True
        if not self.key_started:
            self.listener._forward_starts(self, (batch,), {})
        root = self.listener.model
        self.enter_module("", type(root).__name__, True, (batch,), {})

    def end_step(self) -> None:
        """The step's loss is known: its predictions are bound, later ops are the loss's."""
        if self.step and self.root_depth == 1 and not self.root_done:
            self.exit_module(True, self.step_output)
            self.listener._forward_ended(self)

    def exit_module(self, is_root: bool, output: Any) -> None:
        path = self.stack[-1][0] if self.stack else ""
        super().exit_module(is_root, output)
        if (
            self.step
            and len(self.stack) == 1
            and not self.root_done
            and self.listener._holds_params.get(path, False)
        ):
            self.step_output = output  # the latest top-level call: the step's predictions
            self.scalars_in_pred = True  # a float scalar from here on may be the loss

    # -- tensors ---------------------------------------------------------------------
    def targ(self, t: torch.Tensor, ref: Ref, tainted: bool) -> TArg:
        # WindowBase.targ with fewer calls: it runs for every tensor of every op
        dtype = _DTYPES.get(t.dtype) or dtype_name(t.dtype)  # dtype_name raises for others
        batch = self.tape.batch_size
        if tainted and batch is not None and batch >= 2:
            return TArg(ref, dtype, symbolic_shape(t.shape, batch, True))
        return TArg(ref, dtype, tuple(t.shape))  # a torch.Size holds ints

    def dtype_of(self, t: torch.Tensor) -> str:
        return dtype_name(t.dtype)

    def shape_of(self, t: torch.Tensor) -> tuple[int, ...]:
        return tuple(t.shape)

    def is_float_scalar(self, t: torch.Tensor) -> bool:
        return t.dim() == 0 and t.is_floating_point()

    def digest_of(self, t: torch.Tensor) -> str:
        return tensor_digest(t)

    def one_value(self, t: torch.Tensor) -> float | None:
        if t.numel() != 1 or t.is_complex() or t.device.type == "meta":
            return None
        try:
            return float(t.reshape(()).item())
        except Exception:  # a tensor with no value to read (a fake one): a constant
            return None

    def named_inputs(self, args: Any, kwargs: Any) -> list[tuple[str, Any]]:
        if self.step:  # the step's batch: batch_0, batch_1 (or batch_<key>) ...
            flat_batch: list[tuple[str, torch.Tensor]] = []
            _flatten_tensors(args[0], "batch", flat_batch)
            return [(name.replace(".", "_"), t) for name, t in flat_batch]
        try:
            bound = self.listener._forward_signature().bind(*args, **kwargs)
            named = list(bound.arguments.items())
        except (TypeError, ValueError):
            named = [(f"input_{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
        flat: list[tuple[str, torch.Tensor]] = []
        for name, value in named:
            _flatten_tensors(value, name, flat)
        return [(name.replace(".", "_"), t) for name, t in flat]

    def named_outputs(self, output: Any) -> list[tuple[str, Any]]:
        flat: list[tuple[str, torch.Tensor]] = []
        _flatten_tensors(output, "prediction", flat)
        return flat

    def mask(self, rec_index: int) -> np.ndarray:
        drawn = self.draws.get(rec_index)
        if drawn is not None:
            if not drawn.is_floating_point():  # randint's: the values of its float32 draw node
                drawn = drawn.to(torch.float32)
            return to_array(drawn)
        outs = self.rec_out[rec_index]
        m = outs[1] if len(outs) > 1 and outs[1].dtype == torch.bool else outs[0] != 0
        return to_array(m)

    # -- ops --------------------------------------------------------------------------
    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        if func.namespace == "profiler":
            return  # record_function markers (trainers profile their steps): no algebra
        if self.call is not None:
            self.call.saw(func, args, kwargs)  # recurrent.py records the call, not its ops
            return
        if torch._C._current_graph_task_id() != -1:
            self.saw_backward = True
            return
        if self.saw_backward:
            return  # after backward: optimizer and bookkeeping, in neither graph
        region = self.region()
        if region is None:
            return  # before the forward: preprocessing, not part of either graph
        if region == "post" and self._prepares_data(func, args, kwargs, out):
            return
        # a method, not a closure: a recursive closure is a reference cycle, and
        # it would keep the window (its tape, its tensors) alive until the
        # garbage collector ran
        self._arg_tainted = False
        nargs = self._norm(args, region)
        nkwargs = (
            tuple([(k, self._norm(v, region)) for k, v in sorted(kwargs.items())]) if kwargs else ()
        )
        tainted = self._arg_tainted
        outs: list[torch.Tensor]
        if isinstance(out, torch.Tensor):  # flatten_tensors' usual case, without its call
            outs = [out]
        else:
            outs = []
            flatten_tensors(out, outs)
        n_returned = len(outs)
        info = _op_info(func)
        mutated: tuple[int, ...] = ()
        if info.mutated or info.batch_norm:
            mutated = tuple(
                [i for i in _mutated_args(func, info, args) if isinstance(args[i], torch.Tensor)]
            )
            outs.extend([args[i] for i in mutated])
        name = info.name
        if name in _RESTRIDES and _keeps_values(args):
            # a relayout of the same values (adaptive_avg_pool's output restrided
            # to the input's memory format): the tensor itself, base untouched
            self.record(RESTRIDE, region, nargs, nkwargs, outs, n_returned, tainted, _restrided)
            return
        index = self.record(name, region, nargs, nkwargs, outs, n_returned, tainted, func, mutated)
        if name in _NOTED:
            self._note(name, index, args, kwargs, outs)
        self.track_views(name, info, args, outs, region, index)
        if region == "post" and name == "aten.ones_like.default":
            self.note_seed(args, kwargs, nargs)

    def _prepares_data(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> bool:
        """Is an op after the forward data preparation (y[idx], y.long())? It
        is not part of the loss graph: its outputs stay unknown, so the loss
        meets them as targets (batch-sized) or constants. A selection by a
        mask (y[keep]) is recorded: its size is the data's count, which the
        selected predictions share (a count equal to the batch size is no batch)."""
        tensors = _tensors_in((args, kwargs))
        return (
            not self.from_model(tensors)
            and not self.reduces_targets(tensors, _flat(out))
            and not _selects(func, args)
        )

    def _note(
        self, name: str, index: int, args: Any, kwargs: dict[str, Any], outs: list[Any]
    ) -> None:
        """What a record of a random draw or a selection keeps beside the tape:
        the values drawn (the sample replays them), a selection's count (the
        fingerprint reads it: Tape.selected)."""
        if name in SELECTS:
            axis = selection_axis(self.tape.recs[index])
            if axis is not None:
                self.tape.selected.append((index, int(outs[0].shape[axis])))
        elif name in DRAW_OPS:
            self.draws[index] = outs[0].detach().clone()
        elif name == TOPK:
            _k, dim, largest, ordered = topk_args(args, kwargs)
            if not ordered:  # what it picked, in its order, as the draw its rule replays
                self.draws[index] = topk_keys(outs[1], int(args[0].shape[dim]), dim)
        elif name == RRELU and rrelu_draws(args, kwargs):
            self.draws[index] = args[1].detach().clone()  # the slopes it drew (its noise)

    def _norm(self, a: Any, region: str) -> Any:
        """An op argument as the tape holds it: a tensor as its TArg (noting in
        ``_arg_tainted`` whether it derives from the data), containers walked."""
        if isinstance(a, torch.Tensor):
            targ = self.arg(a, region)
            if targ.ref in self.taint:
                self._arg_tainted = True
            return targ
        if isinstance(a, (list, tuple)):  # plain items kept without a call
            return tuple(
                [x if x is None or type(x) in _PLAIN_TYPES else self._norm(x, region) for x in a]
            )
        if a is None or isinstance(a, _PLAIN):
            return a
        return str(a)

    def note_seed(self, args: tuple[Any, ...], kwargs: dict[str, Any], nargs: Any) -> None:
        """ones_like of a 0-d tensor after the forward: autograd's seed for loss.backward()."""
        if (
            kwargs.get("memory_format") is torch.preserve_format
            and isinstance(args[0], torch.Tensor)
            and args[0].dim() == 0
        ):
            self.seed = nargs[0].ref

    def track_views(
        self,
        name: str,
        info: _OpInfo,
        args: tuple[Any, ...],
        outs: list[torch.Tensor],
        region: str,
        index: int,
    ) -> None:
        """Remember which record made each view; a write into one updates its base."""
        if name in _VIEW_OPS and outs:  # autograd sets _base only after dispatch returns
            self.views[id(outs[0])] = index
        elif info.writes_self and isinstance(args[0], torch.Tensor) and args[0]._base is not None:
            self.write_through(args[0], region, index)

    def write_through(self, view: torch.Tensor, region: str, write: int) -> None:
        """An in-place write into a view (``shifted[:, 1:] = x``) changes the
        view's base: a record gives the base its new value, the old base with
        the view's region replaced. A view of a view (``coords[:, :, 0] += k``:
        slice, slice, select) is walked back to the base, and each view on the
        way gets its new value in turn, innermost first (a view this cannot
        express makes the base unsupported from here on, never silently stale)."""
        base = view._base
        assert base is not None
        base_ref = self.refs.get(id(base))
        chain = self._view_chain(self.views.get(id(view)), base_ref)
        value = self.tape.recs[write].outs[0]
        if chain is None:
            base_arg = self.arg(base, region)
            tainted = base_arg.ref in self.taint or value.ref in self.taint
            self.record(
                VIEW_WRITE,
                region,
                (base_arg, value, "unknown"),
                (),
                [base],
                1,
                tainted,
                _view_write_replay,
            )
            return
        for k, source in enumerate(chain):  # the written view's own record first
            outer = k == len(chain) - 1
            parent = self.arg(base, region) if outer else source.args[0]
            # an inner view's new value has no tensor of its own: a stand-in of its
            # type, kept with the window so that its id is never another tensor's
            held = base if outer else _stand_in(parent, self.tape.batch_size or 1)
            tainted = parent.ref in self.taint or value.ref in self.taint
            args = (parent, value, source.op, *source.args[1:])
            index = self.record(
                VIEW_WRITE, region, args, (), [held], 1, tainted, _view_write_replay
            )
            value = self.tape.recs[index].outs[0]

    def _view_chain(self, index: int | None, base_ref: Ref | None) -> list[Any] | None:
        """The view records (_VIEW_OPS) from a view back to its base, the view's
        own first; None where a link is not such a record or does not reach it."""
        chain: list[Any] = []
        while index is not None and len(chain) < 16:
            source = self.tape.recs[index]
            if source.op not in _VIEW_OPS or not isinstance(source.args[0], TArg):
                return None
            chain.append(source)
            parent = source.args[0].ref
            if base_ref is not None and parent == base_ref:
                return chain
            if parent[0] != "o" or self.tape.recs[parent[1]].op not in _VIEW_OPS:
                return None
            index = parent[1]
        return None

    # -- the loss -----------------------------------------------------------------------
    def loss_ref(self) -> Ref | None:
        if self.explicit_loss is not None:
            return self.explicit_loss
        if self.seed is not None and self.saw_backward:
            return self.seed
        if self.last_scalar is not None:
            # Autograd attaches history to the same tensor after dispatch, so
            # requires_grad is read now, not when the op ran.
            if self.phase == "eval" or self.tensor(self.last_scalar).requires_grad:
                return self.last_scalar
        return None


class _Watched:
    """The recorder on the stack for a window (``mode``), or pushed later by
    ``_push_recorder`` (a fast window whose guards failed); off the stack at
    the window's end either way. A class, not a generator: a fast window's
    whole cost is a few of these calls."""

    __slots__ = ("listener", "mode")

    def __init__(self, listener: TorchListener, mode: _Mode | None) -> None:
        self.listener, self.mode = listener, mode

    def __enter__(self) -> None:
        if self.mode is not None:
            self.mode.__enter__()
            on_backward(self.listener._backward_begins)

    def __exit__(self, *exc: Any) -> None:
        late, self.listener._mode = self.listener._mode, None
        if late is not None or self.mode is not None:
            on_backward(None)
        if self.mode is not None:
            if self.mode.on_stack:  # else it left as backward started
                self.mode.__exit__(*exc)
        elif late is not None and late.on_stack:
            n = torch._C._len_torch_dispatch_stack()
            if n and torch._C._get_dispatch_stack_at(n - 1) is late:
                late.__exit__(None, None, None)


class TorchListener(GuardedCounting, ListenerBase):
    """Records the algebra of each training batch of a torch.nn.Module.

    Use ``with listener.batch():`` around the forward pass, the loss and
    (optionally) ``loss.backward()``; call ``close()`` (or use the listener as
    a context manager) to complete the log directory.

    The log reaches disk as training goes: each new unique graph and the
    sample when first recorded, the counts at checkpoints. Options:

    - ``overwrite`` (False): a ``log_dir`` that already holds a log raises
      ``tracelog.LogExistsError`` here, before training; True removes that
      log and the programs emitted from it (``program_*.py``, ``model.onnx``).
    - ``checkpoint_every_s`` (5.0) and ``checkpoint_every_batches`` (200):
      the counts are written after that many seconds or batches, whichever
      comes first (checked as each batch ends). The default 200 batches are
      spaced so that checkpoints cost at most 1% of the run's time (on a fast
      step, 200 batches take less than a hundred checkpoints' cost); a number
      given is kept exactly.
    - ``checkpoint_weights`` (False): rewrite weights.safetensors at every
      checkpoint (else when a new graph brings constants, at close, and on
      the interrupted paths below).
    - ``strict`` (False): raise recording errors instead of failing open.
    - ``ranks`` (0): under ``torch.distributed``, the ranks that record. One
      rank writes ``log_dir`` (the others record nothing and write nothing);
      ``"all"`` or a list of ranks: each writes ``log_dir/rank<N>``. A model
      wrapped in ``DistributedDataParallel`` is recorded as the module it wraps.
    - ``mode`` ("guarded"): once a batch's key (its modes, input shapes and
      dtypes, module tree, and the module and function calls it made:
      ``guards.py``) gave the same graphs ``guard_after`` (K, 3) exact
      recordings in a row, later batches with the same key run without the
      recorder and are counted for those graphs; every ``rerecord_every``
      (N, 100) batches and the first batch of each epoch are recorded
      exactly again, and an exact recording that contradicts the key puts
      the run back in exact mode, saying so. ``"exact"`` records every
      batch op by op. trace.json counts, per graph, the batches recorded
      exactly and those counted under guards.

    A listener never closed writes a last checkpoint (weights included) at
    interpreter exit (atexit: a normal exit or ``SystemExit``), marked
    interrupted. SIGTERM's default action ends Python without atexit: the
    log is as of its last checkpoint, as after SIGKILL; to flush on SIGTERM,
    turn it into ``SystemExit`` (``signal.signal(signal.SIGTERM, lambda *_:
    sys.exit(143))``).
    """

    model: torch.nn.Module
    rules = ATEN
    no_forward_reason = "the model's forward did not run inside the batch window"
    raised_reason = "_UserError: the batch raised {}"
    # the reference's backward runs on float64 copies, outside any mode (dispatch
    # and function modes, grad mode and autograd's reading are per thread)
    reference_in_background = True

    def __init__(
        self,
        model: torch.nn.Module,
        log_dir: str | os.PathLike[str],
        *,
        ranks: Ranks = 0,
        mode: str = "guarded",
        guard_after: int = 3,
        rerecord_every: int = 100,
        **options: Any,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"TorchListener needs a torch.nn.Module, got {type(model).__name__}")
        self._book = GuardBook(mode, guard_after, rerecord_every)  # a bad option raises here
        self.busy = 0  # > 0 while the listener runs torch ops of its own inside a window
        model, compiled = unwrap_compiled(unwrap(model))
        model = unwrap(model)  # torch.compile(DDP(model))
        facts = world()
        records, log_dir = placement(ranks, log_dir, facts)
        super().__init__(
            TraceLog(_framework_facts(model)),
            model,
            log_dir,
            inert=not records,
            **options,
        )
        self._window: _Window | FastWindow | None = None
        self._mode: _Mode | None = None
        self._distributed = facts is not None
        if facts is not None:
            self.log.distributed = facts_for_log(facts, ranks)
        self.log.optimizer_steps = 0
        self._steps_model: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._last_optimizer: tuple[weakref.ref[Any], bool] | None = None
        self._handles: list[Any] = []
        # a root forward outside any window, in eval mode, is an eval window of
        # its own (a trainer's evaluation loop, which has no hook before a batch)
        self.eval_windows = False
        self._auto: list[Any] = []  # the open auto window's context manager
        self._quieted: list[tuple[Any, str, bool, Any]] = []
        self._holds_params: dict[str, bool] = {}
        self._compiled = compiled
        self._tree_version = 0  # moves when a parameter or submodule is registered on ours
        self._tree_seen = -1
        # by the root's training flag: the static key the last forward of that phase read
        self._statics: dict[bool, int] = {}
        self._cuda = torch.cuda.is_available()  # CUDA autocast is in the key only where it is
        self._static_numbers: dict[tuple[Any, ...], int] = {}  # _tree_key's
        self._params: list[torch.nn.Parameter] = []
        self._modules: list[torch.nn.Module] = []
        self._named_modules: list[tuple[str, torch.nn.Module]] = []  # (path prefix, module)
        # was the last batch counted under guards (not recorded op by op)?
        self.last_guarded = False
        self._module_ids = {id(m) for m in model.modules()}
        self._dispatch_depth = 0
        self._warned_guards: set[str] = set()
        self.log.recording = self._book.to_json()
        self._unwatched = _Watched(self, None)  # every fast window's (it holds no state)
        self._recurrent_scopes = RecurrentScopes()  # recurrent calls recorded whole (recurrent.py)
        wrap_pad_packed(_window_of)  # and pad_packed_sequence's call (once per process)
        self._inner: list[tuple[torch.nn.Module, bool]] = []  # non-root: (module, recurrent)
        # modules whose calls the root's call implies, with their pre hook (a scope
        # only), registered with the post hooks (_scopes)
        # (module, hook, the ids of the pre hooks it had as the listener attached)
        self._implied: list[tuple[torch.nn.Module, Callable[..., None], frozenset[int]]] = []
        self._implied_ids: set[int] = set()  # of those, the ones whose calls are not noted
        self._scope_handles: list[Any] = []
        self._scoped = False
        self._signature: tuple[Any, inspect.Signature] | None = None
        if self.inert:
            return  # a rank that does not record: no hooks at all
        self._handles.append(register_module_module_registration_hook(self._tree_changed))
        self._handles.append(register_module_parameter_registration_hook(self._tree_changed))
        self._handles.append(register_optimizer_step_post_hook(self._optimizer_stepped))
        self._handles.append(register_optimizer_step_pre_hook(self._optimizer_steps))
        if compiled:  # nothing added to a compiled model: its batches are counted (compiled.py)
            logger.warning(COMPILED_WARNING)
            return
        # Permanent: a pre hook on every module (the key's module calls, and a
        # recorded scope in exact windows) and the root's post hook. The other
        # modules' post hooks matter only while an exact window records: they
        # are registered with its recorder and removed as a fast window begins
        # (_scopes), since every hook a module has costs a fast window a call
        # (~3 us: torch's _call_impl takes its slow path for a module with any
        # hook). So do the pre hooks of modules whose calls the root's call
        # implies (an nn.Sequential's children: guards.implied_calls): the key
        # need not note those calls.
        implied = implied_calls(model)
        for path, mod in model.named_modules():
            self._holds_params[path] = any(True for _ in mod.parameters())
            if _is_metric(mod):  # torchmetrics: never part of the graphs
                self.quiet(mod, "update", "compute", "forward")
            # the recurrent scope: layers that make a torch._VF call (recurrent.py)
            recurrent = isinstance(mod, torch.nn.RNNBase) and next(mod.children(), None) is None
            tname = type(mod).__name__
            if mod is model:
                self._handles.append(
                    mod.register_forward_pre_hook(
                        self._root_pre_hook(tname, recurrent), with_kwargs=True
                    )
                )
                self._handles.append(
                    mod.register_forward_hook(
                        self._root_post_hook(recurrent), with_kwargs=True, always_call=True
                    )
                )
            elif id(mod) in implied:
                hook = self._pre_hook(path, tname, recurrent, False)
                self._implied.append((mod, hook, frozenset(mod._forward_pre_hooks)))
                self._implied_ids.add(id(mod))
                self._inner.append((mod, recurrent))
            else:
                self._handles.append(
                    mod.register_forward_pre_hook(self._pre_hook(path, tname, recurrent, True))
                )
                self._inner.append((mod, recurrent))

    def _forward_signature(self) -> inspect.Signature:
        """The root's forward signature (named inputs), read once per forward
        function: inspect.signature costs an exact window more than its ops."""
        forward = self.model.forward
        fn = getattr(forward, "__func__", forward)
        cached = self._signature
        if cached is None or cached[0] is not fn:
            cached = self._signature = (fn, inspect.signature(forward))
        return cached[1]

    # -- the window ------------------------------------------------------------------------
    def _new_window(self) -> _Window:
        # the phase is the model's mode now, and again when its forward starts
        phase = "train" if self.model.training else "eval"
        return _Window(self, phase, self.epoch, self._next_batch(phase))

    def open_batch(self) -> Any:
        """``listener.batch()`` entered by hand, for a trainer's hooks: returns
        the context manager to ``close_batch``. No-op (None) once closed."""
        if self._closed or self._window is not None or self.inert:
            return None
        cm = self.batch()
        cm.__enter__()
        return cm

    def close_batch(self, cm: Any, error: BaseException | None = None) -> None:
        """End a window ``open_batch`` opened (``error``: the step raised it)."""
        if cm is None:
            return
        if error is None:
            cm.__exit__(None, None, None)
        else:
            with contextlib.suppress(BaseException):
                cm.__exit__(type(error), error, error.__traceback__)

    @property
    def window(self) -> _Window | FastWindow | None:
        """The open batch window, if any (for trainer callbacks)."""
        return self._window

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Ops run inside are not recorded (a trainer's logging, metrics)."""
        mode = self._mode if self._window is not None else None
        if mode is None:
            self.busy += 1  # nor noted in a fast window's key
            try:
                yield
            finally:
                self.busy -= 1
            return
        saved, mode.window = mode.window, None
        self.busy += 1
        try:
            yield
        finally:
            mode.window = saved
            self.busy -= 1

    def quiet(self, obj: Any, *names: str) -> None:
        """Run these methods of ``obj`` with recording paused (instance
        attributes wrapping them, removed when the listener closes)."""
        if self.inert:
            return
        for name in names:
            method = getattr(obj, name, None)
            if method is None or not callable(method):
                continue
            own = name in vars(obj)  # an instance attribute already (torchmetrics' update)
            setattr(obj, name, self._paused_call(method))
            self._quieted.append((obj, name, own, method))

    def _paused_call(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def paused_call(*args: Any, **kwargs: Any) -> Any:
            with self.paused():
                return method(*args, **kwargs)

        return paused_call

    def _watching(self, w: _Window | FastWindow, before: StateBefore | None) -> Any:
        if isinstance(w, FastWindow):  # never for a compiled model (_begin_window)
            # the recorder is pushed only if the batch turns out to need it
            self._dispatch_depth = torch._C._len_torch_dispatch_stack()
            return self._unwatched
        if self._compiled:
            w.stop(COMPILED_REASON)
            return contextlib.nullcontext()
        self._scopes(True)
        self._pause_collector()
        self._mode = _Mode(w)
        return _Watched(self, self._mode)

    # -- the guarded fast path -------------------------------------------------------------
    def _begin_window(self) -> _Window | FastWindow:
        """A fast window where the guard book allows one (guards.py), else an
        exact window as before."""
        book = self._book
        training = self.model.training
        sample_due = training and self._sample is None and not self._sample_failed
        if book.mode == "guarded" and not self._compiled and not sample_due:
            # the static key the last forward of this phase started with, not
            # read again here: it is read, and compared, as the forward starts
            static = self._statics.get(training)
            if static is not None and book.may_guard(static, self.epoch):
                if self._scoped:
                    self._scopes(False)
                phase = "train" if training else "eval"
                return FastWindow(self, phase, self.epoch, self._next_batch(phase), static)
        return super()._begin_window()

    def _tree_key(self) -> int:
        """The model's facts that decide a batch's graphs (guards.py), read as
        the forward starts: the key's static part, as the number of the facts'
        tuple (hashed once here: the guard book looks a batch's static part up
        several times). Remembered by the root's training flag (its phase)."""
        if self._tree_seen != self._tree_version:
            self._read_tree()
        training = tuple(map(_TRAINING, self._modules))
        facts = (
            training,  # the root's first: the phase
            tuple(map(_REQUIRES_GRAD, self._params)),
            self._tree_version,
            torch.get_default_dtype(),
            torch._C._get_deterministic_algorithms(),  # are_deterministic_algorithms_enabled
        )
        static = self._static_numbers.get(facts)
        if static is None:
            static = self._static_numbers[facts] = len(self._static_numbers)
        if self._statics.get(training[0]) != static:
            self._statics[training[0]] = static
        return static

    def _tree_changed(self, module: torch.nn.Module, name: str, value: Any) -> None:
        """A global registration hook: a parameter or submodule of one of our modules."""
        if id(module) in self._module_ids:
            self._tree_version += 1

    def _forward_starts(
        self, w: _Window | FastWindow, args: Any, kwargs: Any
    ) -> _Window | FastWindow:
        """The root's forward (or a trainer's step) starts: read the key's
        static part and inputs; a fast window whose guards fail becomes an
        exact window (the recorder pushed now: ops before the forward are
        never recorded, so nothing is lost). Then note the calls."""
        w.key_started = True
        if self._book.mode == "exact" or self._compiled:
            return w
        try:
            static = self._tree_key()  # now: a trainer may switch modes after the window opened
            # the modes that decide a batch's graphs, read as the forward starts (a
            # torch.no_grad() inside the window counts); CUDA autocast only where CUDA
            # is: elsewhere torch turns it off whatever is asked, so it decides nothing
            modes: tuple[Any, ...] = (
                torch.is_grad_enabled(),
                torch.is_inference_mode_enabled(),
                torch.is_autocast_enabled("cpu"),
                torch.get_autocast_dtype("cpu"),
            )
            if self._cuda:
                modes += (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
            inputs = (modes, input_key(args, kwargs))
        except Exception as e:  # fail open: no key, the batch recorded exactly or not at all
            if isinstance(w, FastWindow):
                w.fail(e)
            return w
        if isinstance(w, FastWindow):
            w.streak = self._book.trusted_for(static, inputs) if static == w.static else None
            if w.streak is None:  # no trusted key starts so: recorded exactly
                w = self._to_exact(w)
        w.static, w.inputs = static, inputs
        w.calls = Calls(self, w)  # module calls from now; function calls once the forward ends
        return w

    def _forward_ended(self, w: _Window | FastWindow, output: Any = None) -> None:
        """The root's first call returned: the key reads the loss, from here
        to the first backward (guards.py: from the autograd graph, where the
        output requires grad; else function calls). Not inside the forward: a
        TorchFunctionMode on the stack turns off fused fast paths there
        (``has_torch_function``: attention in inference), which would change
        what runs."""
        calls = w.calls
        if calls is not None and not calls.started and w.root_done:
            if not torch.is_grad_enabled():
                calls.start(())
            elif isinstance(output, torch.Tensor):  # _grad_fns of the usual output, inline
                calls.start(() if output.grad_fn is None else (output.grad_fn,))
            else:
                calls.start(_grad_fns(output))

    def _to_exact(self, fw: FastWindow) -> _Window:
        """A fast window's guards failed as its forward starts: record it exactly."""
        w = _Window(self, fw.phase, fw.epoch, fw.batch)
        w.key_started = True
        self._window = w
        self._push_recorder(w)
        return w

    def _push_recorder(self, w: _Window) -> None:
        """The recorder for ``w``, pushed in a window that began without it
        (or pushed again: it left the stack as the last micro-batch's backward
        started)."""
        mode = self._mode
        if mode is not None and mode.on_stack:
            self._scopes(True)  # removed if a fast micro-batch came between
            mode.window = w
            on_backward(self._backward_begins)
            return
        if torch._C._len_torch_dispatch_stack() != self._dispatch_depth:
            # a dispatch mode pushed inside the window and still there: the
            # recorder cannot go below it, nor above it and be popped in order
            w.stop("another TorchDispatchMode was pushed inside the batch window")
            return
        self._scopes(True)
        self._pause_collector()
        if mode is None:
            mode = self._mode = _Mode(w)
        mode.window = w
        mode.__enter__()
        on_backward(self._backward_begins)

    def _backward_begins(self, roots: Any) -> None:
        """``torch.autograd.backward`` or ``grad`` starts in an exact window:
        no op from here on is in either graph (``on_op``), so the recorder
        leaves the dispatch stack and backward's ops run without it, as do the
        rest of the window's (an MLP's backward has more ops than its forward:
        issue 18). The loss is the backward's root, as autograd's seed
        (``ones_like`` of it, made inside backward) said while the recorder
        saw it. Where backward starts some other way (the engine called
        directly), the recorder stays and leaves its ops out as before."""
        if self.busy:  # the listener's own autograd (a sample's gradients)
            return
        on_backward(None)  # once: a later micro-batch registers again
        mode, w = self._mode, self._window
        if mode is None or not mode.on_stack or w is None or mode.window is not w:
            return
        if w.call is not None:  # a recurrent call in progress (recurrent.py) reads its ops
            return
        n = torch._C._len_torch_dispatch_stack()
        if not n or torch._C._get_dispatch_stack_at(n - 1) is not mode:
            return  # another mode above it: never pop another's
        if not w.saw_backward:
            root = roots if isinstance(roots, torch.Tensor) else None
            if root is None and isinstance(roots, (tuple, list)) and len(roots) == 1:
                root = roots[0]
            if isinstance(root, torch.Tensor) and root.dim() == 0:
                ref = w.refs.get(id(root))
                if ref is not None and w.region() == "post":
                    w.seed = ref
            w.saw_backward = True
        mode.__exit__(None, None, None)
        self._dispatch_depth = n - 1  # where a next micro-batch's recorder goes

    def _next_micro_batch(self, w: _Window | FastWindow) -> None:
        """The root's forward starts again after a forward and its backward in
        the same window (gradient accumulation): that micro-batch is a batch
        of its own. It is counted now, its sample gradients being the
        gradients as they stand (its own, past what the window began with),
        and the rest of the window is the next micro-batch's."""
        mode = self._mode
        if mode is not None:
            mode.window = None  # counting and sampling run torch ops: none of them recorded
        try:
            self._end_window(w)
            self._window = self._begin_window()
        except Exception as e:  # fail open: the rest of the window goes unrecorded
            if self.strict:
                raise
            self._window = self._new_window()
            self._window.stop(describe(e))
        if isinstance(self._window, _Window):
            self._push_recorder(self._window)
        # a fast window after an exact one: the recorder stays, seeing nothing

    def _end_guarded(self, w: Any) -> bool:
        """A fast window whose key is its trusted one, counted here in one call:
        what ``_end_window``, ``_finish``, ``_record`` and ``_count_fast`` do
        for it, less their calls. Anything else (a branch, no forward, a
        failure) goes the long way."""
        if type(w) is not FastWindow or not w.recording or w.root_calls == 0:
            return False
        calls, streak = w.calls, w.streak
        if calls is None or streak is None:
            return False
        calls.end()  # again on the long way: a no-op then
        # the streak was found by (static, inputs) as the forward started: the
        # calls are what is left to compare
        if tuple(calls.calls) != streak.key[2]:
            return False  # a branch: the long way warns, and holds it if unknown
        pair = streak.pair
        try:
            usages = streak.usages
            if usages is None or usages[0] != w.phase:
                usages = streak.usages = (w.phase, self.log.usages(w.phase, pair[0], pair[1]))
            self.log.count_guarded(usages[1], w.epoch, w.batch)
        except Exception as e:  # fail open, as _finish: counted unrecorded the long way
            w.fail(e)
            return False
        book, static = self._book, w.static
        book.guarded += 1  # GuardBook.counted, for a key equal to the trusted one
        book.since_exact[static] = book.since_exact.get(static, 0) + 1
        self.last_counted = pair
        self.last_guarded = True
        self._batch_counted()
        if self._collector_paused:  # _window_closed
            self._resume_collector()
        return True

    def _end_window(self, w: Any, raised: BaseException | None = None) -> None:
        calls = getattr(w, "calls", None)
        if calls is not None:
            calls.end()  # the key's calls end with the window
        try:
            super()._end_window(w, raised)
        finally:
            local = getattr(w, "local_grads", None)
            if local is not None:  # hooks for one window only
                local.remove()

    def _open_auto_window(self) -> _Window | FastWindow | None:
        try:
            cm = self.open_batch()
        except Exception as e:  # fail open
            logger.warning("tracelog: eval batch not recorded: %s", describe(e))
            return None
        if cm is not None:
            self._auto.append(cm)
        return self._window

    def _optimizer_steps(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """A global optimizer step pre hook: the key's function calls ended
        with the first backward, so their mode leaves the stack here, where
        it can (not inside its own handler, where backward ran): the step's
        tensor reads and updates (36 Python calls a step for an MLP's SGD)
        no longer pass through it."""
        calls = getattr(self._window, "calls", None)
        if calls is not None and calls.started and not calls.on:
            calls.end()

    def _optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """A global optimizer step hook: count the steps of this model's optimizers."""
        try:
            ours: bool | None
            last = self._last_optimizer  # the usual case, one optimizer: no weak dict lookup
            if last is not None and last[0]() is optimizer:
                ours = last[1]
            else:
                ours = self._steps_model.get(optimizer)
                if ours is None:
                    mine = {id(p) for p in self.model.parameters()}
                    ours = any(id(p) in mine for g in optimizer.param_groups for p in g["params"])
                    self._steps_model[optimizer] = ours
                self._last_optimizer = (weakref.ref(optimizer), ours)
            if ours and self.log.optimizer_steps is not None:
                self.log.optimizer_steps += 1
        except Exception as e:  # fail open: a step is never stopped by counting it
            logger.warning("tracelog: optimizer step not counted: %s", describe(e))

    def _static_refs(self) -> dict[int, Ref]:
        """Parameters and buffers by id, as named_parameters and named_buffers
        name them (a shared one under its first name), read from the modules'
        own tables: the module list is walked once per tree version."""
        self._read_tree()
        refs: dict[int, Ref] = {}
        for prefix, mod in self._named_modules:
            for name, p in mod._parameters.items():
                if p is not None and id(p) not in refs:
                    refs[id(p)] = ("p", prefix + name)
        for prefix, mod in self._named_modules:
            for name, b in mod._buffers.items():
                if b is not None and refs.get(id(b), ("p",))[0] == "p":
                    refs[id(b)] = ("b", prefix + name)
        return refs

    def _read_tree(self) -> None:
        """The module tree's lists, read again when its version moved."""
        if self._tree_seen != self._tree_version:
            self._params = list(self.model.parameters())
            self._named_modules = [
                (f"{path}." if path else "", m) for path, m in self.model.named_modules()
            ]
            self._modules = [m for _, m in self._named_modules]
            self._module_ids = {id(m) for m in self._modules}  # a new submodule's too
            self._tree_seen = self._tree_version
            if self._implied_ids:
                self._note_no_longer_implied()

    def _note_no_longer_implied(self) -> None:
        """The tree changed: a module whose calls the root's call implied, now
        held by another module too (whose forward may call it or not), has its
        calls noted in the key from now on, by a pre hook of its own (its
        scope stays with the exact windows' hooks)."""
        implied = implied_calls(self.model)
        for path, mod in self.model.named_modules():
            if id(mod) in self._implied_ids and id(mod) not in implied:
                self._implied_ids.discard(id(mod))
                noting = self._pre_hook(path, type(mod).__name__, False, True, False)
                self._handles.append(mod.register_forward_pre_hook(noting))

    def _root_pre_hook(self, tname: str, recurrent: bool) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if compiling():
                return  # traced by Dynamo: adds nothing to the compiled graph
            w = self._window
            if type(w) is FastWindow and not w.key_started:
                w = self._fast_forward_starts(w, args, kwargs, recurrent)
                if w is None:
                    return
            else:
                w = self._root_window(module, args, kwargs)
            if w is None:
                if recurrent:
                    self._recurrent_scopes.enter(None)  # the post hook always runs: balanced
                return
            calls = w.calls
            if calls is not None and calls.on:
                calls.calls.append("")  # the key's module calls
            if isinstance(w, FastWindow):  # no tape: only the root's calls are followed
                w.enter_root()
                if recurrent:
                    self._recurrent_scopes.enter(None)
                return
            w.guarded(w.enter_module, "", tname, True, args, kwargs)
            if recurrent:
                self._recurrent_scopes.enter(w)

        return hook

    def _fast_forward_starts(
        self, w: FastWindow, args: Any, kwargs: Any, recurrent: bool
    ) -> _Window | FastWindow | None:
        """The root pre hook's work as a fast window's forward starts (the
        usual guarded batch), in fewer calls: what ``_root_window`` comes to
        for it, then, where its guards hold, the root call entered (None: the
        hook is done); else the exact window it became, for the hook to enter."""
        v = self._forward_starts(w, args, kwargs)
        if type(v) is not FastWindow:
            return v
        if w.calls is not None:  # else the key failed to read: w stopped, counted unrecorded
            w.calls.calls.append("")  # the key's root call
        w.enter_root()
        if recurrent:
            self._recurrent_scopes.enter(None)
        return None

    def _fast_forward_returned(self, w: FastWindow, output: Any, recurrent: bool) -> None:
        """The root post hook's work as a fast window's forward returns (the
        usual guarded batch): ``exit_root`` inline, then ``_forward_ended``."""
        w.root_depth = 0
        w.root_done = True
        if recurrent:
            self._recurrent_scopes.exit()
        self._forward_ended(w, output)
        if self._auto:
            self.close_batch(self._auto.pop())

    def _root_window(self, module: torch.nn.Module, args: Any, kwargs: Any) -> Any:
        """The window the root's call is in: an eval window opened for it, the
        next micro-batch's, one turned exact as its forward starts, or None."""
        w = self._window
        if w is None and self.eval_windows and not module.training:
            w = self._open_auto_window()
        if w is not None and w.root_depth == 0:
            if w.root_done and w.saw_backward:
                self._next_micro_batch(w)
                w = self._window
            if w is not None and w.root_calls == 0 and not w.key_started:
                w = self._forward_starts(w, args, kwargs)
        return w

    def _pre_hook(
        self, path: str, tname: str, recurrent: bool, noted: bool, scoped: bool = True
    ) -> Callable[..., None]:
        """A non-root module's pre hook: its call noted in the key (`noted`:
        not where the root's call implies it) and, in exact windows, its scope
        entered (`scoped`)."""

        def hook(module: torch.nn.Module, args: Any) -> None:
            if compiling():  # first: Dynamo would guard on what it read before
                return
            w = self._window
            if w is None:
                return
            calls = w.calls
            if noted and calls is not None and calls.on:
                calls.calls.append(path)  # the key's module calls
            if scoped and self._scoped and type(w) is _Window:  # its post hook is there
                w.guarded(w.enter_module, path, tname, False, args, {})
                if recurrent:
                    self._recurrent_scopes.enter(w)

        return hook

    def _root_post_hook(self, recurrent: bool) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if compiling():
                return
            w = self._window
            if type(w) is FastWindow and w.root_depth == 1 and w.root_calls == 1:
                self._fast_forward_returned(w, output, recurrent)
                return
            if w is not None:
                if isinstance(w, FastWindow):
                    w.exit_root()
                else:
                    w.guarded(w.exit_module, True, output)
            if recurrent:
                self._recurrent_scopes.exit()
            if w is not None:
                self._forward_ended(w, output)
                if self._auto and w.root_depth == 0:
                    self.close_batch(self._auto.pop())

        return hook

    def _post_hook(self, recurrent: bool) -> Callable[..., None]:
        """A non-root module's post hook, there while exact windows record (_scopes)."""

        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if compiling():
                return
            w = self._window
            if type(w) is _Window:
                w.guarded(w.exit_module, False, output)
            if recurrent:
                self._recurrent_scopes.exit()

        return hook

    def _scopes(self, on: bool) -> None:
        """Register (an exact window records) or remove (a fast window begins)
        the non-root modules' post hooks. Both happen between module calls: as
        a window opens, or in the root's pre hook. Prepended: they run before
        the user's post hooks, as when they were registered with the listener."""
        if on == self._scoped:
            return
        if on:
            self._scope_handles = [
                _pre_hook_as_at_attach(mod, hook, before) for mod, hook, before in self._implied
            ] + [
                mod.register_forward_hook(
                    self._post_hook(recurrent), always_call=True, prepend=True
                )
                for mod, recurrent in self._inner
            ]
        else:
            for h in self._scope_handles:
                h.remove()
            self._scope_handles = []
        self._scoped = on

    # -- the graphs ------------------------------------------------------------------------
    def _close_tape(self, w: _Window) -> None:
        tape = w.tape
        loss = w.loss_ref() or w.named_loss_output()
        tape.loss = None
        if loss is not None and loss[0] == "o" and not w.take_loss_output(loss):
            # a loss computed after the forward; one inside it is a root output,
            # or, in a step window, any op of the step (split from the
            # predictions by what it reads)
            tape.loss = loss if _is_post(w, loss) or w.step else None
            if tape.loss is not None and not w.step:
                w.drop_loss_output(tape.loss)
        self._read_tree()
        seen: set[int] = set()  # named_buffers' order and names, from the modules' tables
        for prefix, mod in self._named_modules:
            for name, buf in mod._buffers.items():
                if buf is None or id(buf) in seen:
                    continue
                seen.add(id(buf))
                ref = w.refs.get(id(buf))
                if ref is not None and ref != ("b", prefix + name):
                    tape.buffer_updates.append((prefix + name, ref))
        w.custom_functions = _function_bodies(w)

    def _custom_functions(self, w: _Window) -> list[str]:
        return getattr(w, "custom_functions", [])

    def _trainable(self) -> dict[str, bool]:
        return {n: p.requires_grad for n, p in self.model.named_parameters()}

    def _exact_tape(self, w: _Window) -> Tape | None:
        return exact_batch_dims(w.tape)  # a replay on meta tensors

    def _to_numpy(self, t: torch.Tensor) -> np.ndarray:
        return to_numpy(t)

    def _graphs(self, w: WindowBase) -> tuple[Graph, Graph | None, Draws]:
        try:
            return super()._graphs(w)
        except NotSupported as e:
            raise RuntimeError(str(e)) from None

    # -- the sample ------------------------------------------------------------------------
    def _state_before(self, w: _Window) -> StateBefore | None:
        if w.phase != "train":
            return None
        if self._distributed:  # this rank's own gradients (distributed.py)
            w.local_grads = LocalGrads(self.model)
        return StateBefore(
            params={n: to_array(p) for n, p in self.model.named_parameters()},
            buffers={n: to_array(b) for n, b in self.model.named_buffers()},
            grad_state={  # gradients accumulated before this batch
                n: p.grad.detach().clone()
                for n, p in self.model.named_parameters()
                if p.grad is not None
            },
        )

    def _to_array(self, t: torch.Tensor) -> np.ndarray:
        return to_array(t)

    def _record(self, w: WindowBase, before: StateBefore | None) -> None:
        if isinstance(w, FastWindow):
            self._count_fast(w, self.no_forward_reason + MAYBE_COMPILED)
            return
        if w.root_calls == 0 and dynamo_compiled_something():
            raise RuntimeError(self.no_forward_reason + MAYBE_COMPILED)
        super()._record(w, before)
        assert isinstance(w, _Window)
        self._exact_counted(w, w.key())

    def _finish(self, w: WindowBase, before: StateBefore | None) -> None:
        self.last_guarded = False
        super()._finish(w, before)
        if type(w) is not FastWindow and isinstance(w, _Window) and not w.recording:
            self._book.not_recorded(w.static, w.inputs)  # an unrecorded batch breaks a streak

    def _gradients(
        self, w: _Window, before: StateBefore, loss: torch.Tensor
    ) -> dict[str, np.ndarray]:
        params = dict(self.model.named_parameters())
        trainable = [n for n, p in params.items() if p.requires_grad]
        grads: dict[str, np.ndarray] = {}
        local = w.local_grads
        if w.saw_backward and local is not None:  # before DDP's all-reduce averaged them
            if local.failed:
                raise RuntimeError(f"this rank's gradients were not kept: {local.failed}")
            return {n: to_array(local.grads[n]) for n in trainable if n in local.grads}
        if w.saw_backward:
            for n in trainable:
                g = params[n].grad
                if g is None:
                    continue
                g = g.detach()
                if n in before.grad_state:
                    g = g - before.grad_state[n]
                grads[n] = to_array(g)
        elif loss.requires_grad:
            found = torch.autograd.grad(
                loss, [params[n] for n in trainable], retain_graph=True, allow_unused=True
            )
            for n, g in zip(trainable, found, strict=True):
                if g is not None:
                    grads[n] = to_array(g)
        return grads

    def _reference64_forward(
        self, w: _Window, before: StateBefore
    ) -> Callable[[], dict[str, Any]] | None:
        return forward64(
            w.tape,
            inputs=w.input_tensors,
            targets=list(w.target_tensors),
            params=before.params,
            buffers=before.buffers,
            rec_out=w.rec_out,
            draws=w.draws,
            trainable=[n for n, t in self._trainable().items() if t],
        )

    def _grads_from(self, w: _Window) -> str:
        if w.saw_backward and w.local_grads is not None:
            return "backward: this rank's own gradients, before the all-reduce"
        return "backward" if w.saw_backward else "autograd.grad"

    def _buffer_now(self, name: str) -> np.ndarray:
        return to_array(dict(self.model.named_buffers())[name])

    # -- closing ---------------------------------------------------------------------------
    def _detach(self) -> None:
        self._count_unresolved()
        self._scopes(False)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for obj, name, own, method in reversed(self._quieted):
            if own:
                setattr(obj, name, method)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
        self._quieted.clear()

    def _model_facts(self) -> dict[str, Any]:
        # read at every write of trace.json, as the guard book's counts are
        self.log.recording = self._book.to_json()
        return _model_facts(self.model)

    def _weights(self) -> dict[str, np.ndarray]:
        # state_dict leaves out non-persistent buffers (position_ids, rotary
        # tables), which graphs read like any other buffer: they are written too
        weights = {n: to_array(t) for n, t in self.model.state_dict(keep_vars=True).items()}
        for n, b in self.model.named_buffers():
            weights.setdefault(n, to_array(b))
        return weights


_PLAIN = (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
_PLAIN_TYPES = frozenset(_PLAIN)  # exactly these types (a subclass goes through isinstance)


# ops whose records keep something beside the tape (_Window._note)
_NOTED = frozenset([*SELECTS, *DRAW_OPS, RRELU, TOPK])
_SELECTIONS = frozenset([torch.ops.aten.masked_select.default, torch.ops.aten.nonzero.default])


def _selects(func: Any, args: tuple[Any, ...]) -> bool:
    """A selection whose size is the data's: x[mask] (a boolean index),
    masked_select, nonzero (called for post-forward ops on targets only)."""
    if func in _SELECTIONS:
        return True
    if func is not torch.ops.aten.index.Tensor or len(args) < 2:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])


def _flat(out: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    flatten_tensors(out, found)
    return found


def _tensors_in(obj: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments (lists, tuples and dict values walked)."""
    found: list[torch.Tensor] = []
    stack = [obj]
    while stack:
        a = stack.pop()
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            stack.extend(a)
        elif isinstance(a, dict):
            stack.extend(a.values())
    return found


def _is_metric(module: torch.nn.Module) -> bool:
    """A torchmetrics metric (found by class name: torchmetrics is not imported)."""
    return any(
        c.__name__ == "Metric" and c.__module__.startswith("torchmetrics")
        for c in type(module).__mro__
    )


def _function_bodies(w: _Window) -> list[str]:
    """Records that ran with grad off but made a tensor that requires grad now
    are a custom autograd Function's (its forward runs without grad, its
    outputs get its backward: DDP's _DDPSink clone, a fused op): they and the
    no-grad records feeding them, its body, are differentiated as recorded
    (as before grad mode was recorded). An in-place write under no_grad into
    a tensor autograd tracks keeps its own rule (builder.stopped). Returns the
    names of the user's Functions among them (torch's own, as DDP's, left out):
    their backward is their own, which the sample checks (base._custom_backwards)."""
    recs = w.tape.recs
    todo = [
        rec.index
        for rec in recs
        if not rec.grad
        and written_in_place(rec) is None
        and any(isinstance(t, torch.Tensor) and t.requires_grad for t in w.rec_out[rec.index])
    ]
    names: set[str] = set()
    for index in todo:
        for t in w.rec_out[index]:
            cls = getattr(getattr(t, "grad_fn", None), "_forward_cls", None)
            if cls is not None and not str(cls.__module__).startswith("torch"):
                names.add(cls.__qualname__)
    while todo:
        rec = recs[todo.pop()]
        if rec.grad:
            continue
        rec.grad = True
        for a in rec.tensor_args():
            if a.ref[0] == "o" and not recs[a.ref[1]].grad:
                if written_in_place(recs[a.ref[1]]) is None:
                    todo.append(a.ref[1])
    return sorted(names)


def _is_post(w: _Window, ref: Ref) -> bool:
    return w.tape.recs[ref[1]].region == "post"


def _framework_facts(model: torch.nn.Module) -> dict[str, Any]:
    try:
        device = str(next(model.parameters()).device)
    except StopIteration:
        device = "cpu"
    return {
        "name": "torch",
        "version": torch.__version__,
        "device": device,
        "python": platform.python_version(),
        "notes": (
            "ops as the dispatcher shows them on this device: on CPU, dropout runs as "
            "bernoulli_/div_/mul and is recorded as Dropout with its mask"
        ),
    }


def _model_facts(model: torch.nn.Module) -> dict[str, Any]:
    return {
        "class": type(model).__name__,
        "params": [
            {
                "name": n,
                "dtype": dtype_name(p.dtype),
                "shape": list(p.shape),
                "trainable": p.requires_grad,
            }
            for n, p in model.named_parameters()
        ],
        "buffers": [
            {"name": n, "dtype": dtype_name(b.dtype), "shape": list(b.shape)}
            for n, b in model.named_buffers()
        ],
    }


__all__ = ["TorchListener"]
