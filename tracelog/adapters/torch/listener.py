"""The PyTorch listener: a TorchDispatchMode active only inside batch windows.

Rules it keeps (DESIGN.md): it never perturbs training (no RNG draws, no
syncs, no changed numerics: every op runs exactly as it would without it),
it fails open (an error while recording drops that batch's record, counts it
as unrecorded and lets training go on), and after warm-up a batch costs a
fingerprint of its light tape; IR is built only for unseen fingerprints.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import platform
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tracelog.adapters.base import ListenerBase
from tracelog.adapters.builder import Builder, NotSupported
from tracelog.adapters.tape import ConstInfo, Rec, Ref, Tape, TArg, symbolic_shape
from tracelog.log import TraceLog

from .batch_dims import exact_batch_dims
from .rules import ATEN
from .tensors import dtype_name, flatten_tensors, tensor_digest, to_numpy

logger = logging.getLogger("tracelog")

_OP_NAMES: dict[Any, str] = {}
_MUTATED: dict[Any, tuple[int, ...]] = {}


def _op_name(func: Any) -> str:
    name = _OP_NAMES.get(func)
    if name is None:
        name = _OP_NAMES[func] = f"aten.{func.__name__}" if func.namespace == "aten" else str(func)
    return name


def _mutated_args(func: Any, args: tuple[Any, ...]) -> tuple[int, ...]:
    """Positional args an op writes to without returning them."""
    idx = _MUTATED.get(func)
    if idx is None:
        schema = func._schema
        returned = {
            s for r in schema.returns if r.alias_info is not None for s in r.alias_info.after_set
        }
        found = []
        for i, a in enumerate(schema.arguments):
            info = a.alias_info
            if info is not None and info.is_write and not a.kwarg_only:
                if not (set(info.after_set) & returned):
                    found.append(i)
        idx = _MUTATED[func] = tuple(found)
    # native_batch_norm updates the running statistics in place, though its
    # schema does not say so.
    if func is torch.ops.aten.native_batch_norm.default and args[5] and args[3] is not None:
        return (3, 4)
    return idx


def _flatten_tensors(obj: Any, prefix: str, out: list[tuple[str, torch.Tensor]]) -> None:
    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            _flatten_tensors(v, f"{prefix}.{k}", out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flatten_tensors(v, f"{prefix}.{i}", out)


class _Mode(TorchDispatchMode):
    def __init__(self, window: _Window) -> None:
        super().__init__()
        self.window = window

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        w = self.window
        if w.recording:
            try:
                w.on_op(func, args, kwargs, out)
            except Exception as e:  # fail open: training goes on, the batch is unrecorded
                w.fail(e)
        return out


class _Window:
    """One batch window: its tape and the bookkeeping to fill it."""

    def __init__(self, listener: TorchListener, phase: str, epoch: int, batch: int) -> None:
        self.listener = listener
        self.phase, self.epoch, self.batch = phase, epoch, batch
        self.tape = Tape()
        self.refs: dict[int, Ref] = dict(listener._static_refs())
        self.taint: set[Ref] = set()
        self.keep: list[torch.Tensor] = []  # keeps ids stable for the window's life
        self.rec_out: list[list[torch.Tensor]] = []
        self.stack: list[tuple[str, str]] = []
        self.root_depth = 0
        self.root_calls = 0
        self.root_done = False
        self.saw_backward = False
        self.recording = True
        self.error: str | None = None
        self.seed: Ref | None = None
        self.explicit_loss: Ref | None = None
        self.last_scalar: Ref | None = None
        self.input_tensors: dict[str, torch.Tensor] = {}
        self.output_tensors: dict[str, torch.Tensor] = {}
        self.target_tensors: list[torch.Tensor] = []

    def fail(self, e: BaseException) -> None:
        if self.listener.strict and not isinstance(e, _UserError):
            raise e
        self.recording = False
        self.error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]

    # -- module hooks ---------------------------------------------------------------
    def enter_module(self, path: str, tname: str, is_root: bool, args: Any, kwargs: Any) -> None:
        if is_root:
            if self.root_depth == 0:
                self.root_calls += 1
                if self.root_calls == 1:
                    self._bind_inputs(self.listener.model, args, kwargs)
            self.root_depth += 1
        self.stack.append((path, tname))

    def exit_module(self, is_root: bool, output: Any) -> None:
        if self.stack:
            self.stack.pop()
        if is_root:
            self.root_depth -= 1
            if self.root_depth == 0 and self.root_calls == 1:
                self._bind_outputs(output)
                self.root_done = True

    def _bind_inputs(self, model: torch.nn.Module, args: Any, kwargs: Any) -> None:
        try:
            bound = inspect.signature(model.forward).bind(*args, **kwargs)
            named = list(bound.arguments.items())
        except (TypeError, ValueError):
            named = [(f"input_{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
        flat: list[tuple[str, torch.Tensor]] = []
        for name, value in named:
            _flatten_tensors(value, name, flat)
        for name, t in flat:
            name = name.replace(".", "_")
            if self.tape.batch_size is None and t.dim() >= 1:
                self.tape.batch_size = int(t.shape[0])
            ref: Ref = ("i", name)
            self.refs[id(t)] = ref
            self.taint.add(ref)
            self.keep.append(t)
            self.input_tensors[name] = t
        batch = self.tape.batch_size
        for name, t in self.input_tensors.items():
            shape = symbolic_shape(t.shape, batch, True)
            self.tape.inputs[name] = TArg(("i", name), dtype_name(t.dtype), shape)

    def _bind_outputs(self, output: Any) -> None:
        flat: list[tuple[str, torch.Tensor]] = []
        _flatten_tensors(output, "prediction", flat)
        for role, t in flat:
            ref = self.refs.get(id(t))
            if ref is None or ref[0] in ("c", "t"):
                continue
            self.tape.outputs.append((role, ref))
            self.output_tensors[role] = t

    # -- ops --------------------------------------------------------------------------
    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        if torch._C._current_graph_task_id() != -1:
            self.saw_backward = True
            return
        if self.saw_backward:
            return  # after backward: optimizer and bookkeeping, in neither graph
        if self.root_depth > 0 and self.root_calls == 1:
            region = "pred"
        elif self.root_done:
            region = "post"
        else:
            return  # before the forward: preprocessing, not part of either graph
        if region == "post" and not self._uses_model(args, kwargs):
            # Data preparation after the forward (y[idx], y.long()): not part of
            # the loss graph. Its outputs stay unknown, so the loss meets them as
            # targets (batch-sized) or constants.
            return
        tainted = False
        batch = self.tape.batch_size

        def norm(a: Any) -> Any:
            nonlocal tainted
            if isinstance(a, torch.Tensor):
                targ = self._targ(a, region)
                tainted = tainted or targ.ref in self.taint
                return targ
            if isinstance(a, (list, tuple)):
                return tuple(norm(x) for x in a)
            if a is None or isinstance(
                a,
                (
                    bool,
                    int,
                    float,
                    str,
                    torch.dtype,
                    torch.device,
                    torch.layout,
                    torch.memory_format,
                ),
            ):
                return a
            return str(a)

        nargs = norm(args)
        nkwargs = tuple((k, norm(v)) for k, v in sorted(kwargs.items()))
        index = len(self.tape.recs)
        outs: list[torch.Tensor] = []
        flatten_tensors(out, outs)
        n_returned = len(outs)
        mutated = tuple(i for i in _mutated_args(func, args) if isinstance(args[i], torch.Tensor))
        outs.extend(args[i] for i in mutated)
        targs = []
        for k, t in enumerate(outs):
            ref: Ref = ("o", index, k)
            if tainted:
                self.taint.add(ref)
            self.refs[id(t)] = ref
            self.keep.append(t)
            targs.append(TArg(ref, dtype_name(t.dtype), symbolic_shape(t.shape, batch, tainted)))
        self.rec_out.append(outs)
        module = self.stack[-1] if self.stack else ("", "")
        name = _op_name(func)
        self.tape.recs.append(
            Rec(
                index,
                name,
                region,
                module,
                nargs,
                nkwargs,
                tuple(targs),
                n_returned,
                tainted,
                func,
                mutated,
            )
        )
        if region == "post":
            if (
                name == "aten.ones_like.default"
                and kwargs.get("memory_format") is torch.preserve_format
                and isinstance(args[0], torch.Tensor)
                and args[0].dim() == 0
            ):
                self.seed = nargs[0].ref  # autograd's seed for loss.backward()
            for k, t in enumerate(outs[:n_returned]):
                if t.dim() == 0 and t.is_floating_point():
                    self.last_scalar = ("o", index, k)
                    break  # an op's first scalar: nll_loss's second is its total weight

    def _uses_model(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Does any tensor argument come from the model: a data input, a
        parameter, a buffer or a recorded op's output?"""
        stack: list[Any] = [*args, *kwargs.values()]
        while stack:
            a = stack.pop()
            if isinstance(a, torch.Tensor):
                ref = self.refs.get(id(a))
                if ref is not None and ref[0] in ("i", "p", "b", "o"):
                    return True
            elif isinstance(a, (list, tuple)):
                stack.extend(a)
        return False

    def _targ(self, t: torch.Tensor, region: str) -> TArg:
        ref = self.refs.get(id(t))
        if ref is None:
            ref = self._unknown(t, region)
        return TArg(
            ref,
            dtype_name(t.dtype),
            symbolic_shape(t.shape, self.tape.batch_size, ref in self.taint),
        )

    def _unknown(self, t: torch.Tensor, region: str) -> Ref:
        """A tensor from outside the window: a target when the loss region
        meets it with a batch-sized leading dim, else a constant."""
        batch = self.tape.batch_size
        ref: Ref
        if region == "post" and t.dim() >= 1 and batch is not None and t.shape[0] == batch:
            ref = ("t", len(self.tape.targets))
            self.taint.add(ref)
            self.tape.targets.append(
                TArg(ref, dtype_name(t.dtype), symbolic_shape(t.shape, batch, True))
            )
            self.target_tensors.append(t)
        else:
            ref = ("c", len(self.tape.consts))
            self.tape.consts.append(ConstInfo(t, tensor_digest(t)))
        self.refs[id(t)] = ref
        self.keep.append(t)
        return ref

    def mark_loss(self, t: torch.Tensor) -> None:
        ref = self.refs.get(id(t))
        if ref is None:
            raise ValueError("listener.loss() got a tensor that was not computed in this batch")
        self.explicit_loss = ref

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

    def tensor(self, ref: Ref) -> torch.Tensor:
        if ref[0] == "o":
            return self.rec_out[ref[1]][ref[2]]
        if ref[0] == "i":
            return self.input_tensors[ref[1]]
        raise KeyError(ref)


class _UserError(Exception):
    """The user's code raised inside the window; never re-raised by strict mode."""


class TorchListener(ListenerBase):
    """Records the algebra of each training batch of a torch.nn.Module.

    Use ``with listener.batch():`` around the forward pass, the loss and
    (optionally) ``loss.backward()``; call ``close()`` (or use the listener as
    a context manager) to write the log directory.
    """

    def __init__(
        self, model: torch.nn.Module, log_dir: str | os.PathLike[str], *, strict: bool = False
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"TorchListener needs a torch.nn.Module, got {type(model).__name__}")
        super().__init__(TraceLog(_framework_facts(model)))
        self.model = model
        self.log_dir = log_dir
        self.strict = strict  # raise recording errors instead of failing open (for tests)
        self._window: _Window | None = None
        self._cache: dict[Any, tuple[str, str | None, list[int]]] = {}
        self._sample: dict[str, np.ndarray] | None = None
        self._handles = []
        for path, mod in model.named_modules():
            is_root = mod is model
            tname = type(mod).__name__
            self._handles.append(
                mod.register_forward_pre_hook(
                    self._pre_hook(path, tname, is_root), with_kwargs=True
                )
            )
            self._handles.append(
                mod.register_forward_hook(
                    self._post_hook(is_root), with_kwargs=True, always_call=True
                )
            )

    # -- public API ----------------------------------------------------------------------
    @contextlib.contextmanager
    def batch(self, *, epoch: int | None = None) -> Iterator[TorchListener]:
        self._open_batch(epoch)
        phase = "train" if self.model.training else "eval"
        w = _Window(self, phase, self.epoch, self._next_batch(phase))
        before = self._sample_before() if phase == "train" and self._sample is None else None
        self._window = w
        mode = _Mode(w)
        raised: BaseException | None = None
        try:
            with mode:
                yield self
        except BaseException as e:
            raised = e
            raise
        finally:
            self._window = None
            if raised is not None:
                w.fail(_UserError(f"the batch raised {type(raised).__name__}"))
            self._finish(w, before)

    def loss(self, t: torch.Tensor) -> torch.Tensor:
        """Mark the loss of this batch (needed only when backward() is called
        outside the window and the loss is not the last scalar computed)."""
        if self._window is None:
            raise RuntimeError("listener.loss() must be called inside listener.batch()")
        try:
            self._window.mark_loss(t)
        except Exception as e:
            self._window.fail(e)
        return t

    def close(self) -> TraceLog:
        """Write the log directory and detach from the model. Idempotent."""
        if self._closed:
            return self.log
        self._closed = True
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.log.model = _model_facts(self.model)
        weights = {n: _np(t) for n, t in self.model.state_dict(keep_vars=True).items()}
        self.log.write(self.log_dir, weights, self._sample)
        return self.log

    # -- internals -------------------------------------------------------------------------
    def _static_refs(self) -> dict[int, Ref]:
        refs: dict[int, Ref] = {}
        for name, p in self.model.named_parameters():
            refs[id(p)] = ("p", name)
        for name, b in self.model.named_buffers():
            refs[id(b)] = ("b", name)
        return refs

    def _pre_hook(self, path: str, tname: str, is_root: bool):  # noqa: ANN202
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            w = self._window
            if w is not None and w.recording:
                try:
                    w.enter_module(path, tname, is_root, args, kwargs)
                except Exception as e:
                    w.fail(e)

        return hook

    def _post_hook(self, is_root: bool):  # noqa: ANN202
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            w = self._window
            if w is not None and w.recording:
                try:
                    w.exit_module(is_root, output)
                except Exception as e:
                    w.fail(e)

        return hook

    def _finish(self, w: _Window, before: dict[str, Any] | None) -> None:
        try:
            if w.recording:
                self._record(w, before)
        except Exception as e:
            w.fail(e)
        if not w.recording:
            self._count_unrecorded(w.phase, w.epoch, w.batch, w.error)

    def _record(self, w: _Window, before: dict[str, Any] | None) -> None:
        if w.root_calls == 0:
            raise RuntimeError("the model's forward did not run inside the batch window")
        tape = w.tape
        loss = w.loss_ref()
        tape.loss = loss if loss is not None and loss[0] == "o" and self._is_post(w, loss) else None
        for name, buf in self.model.named_buffers():
            ref = w.refs.get(id(buf))
            if ref is not None and ref != ("b", name):
                tape.buffer_updates.append((name, ref))
        fp = tape.fingerprint()
        cached = self._cache.get(fp)
        if cached is None:
            trainable = {n: p.requires_grad for n, p in self.model.named_parameters()}
            # exact batch dims from a meta replay; the equal-size guess if it fails
            builder = Builder(
                exact_batch_dims(tape) or tape, trainable, self.log.constants, ATEN, to_numpy
            )
            builder.convert()
            try:
                pred, loss_graph, masks = builder.graphs()
            except NotSupported as e:
                raise RuntimeError(str(e)) from None
            ph = self.log.add_graph(pred)
            lh = self.log.add_graph(loss_graph) if loss_graph is not None else None
            cached = self._cache[fp] = (ph, lh, masks)
        ph, lh, masks = cached
        self.log.count(w.phase, ph, lh, w.epoch, w.batch)
        if before is not None and lh is not None:
            self._take_sample(w, before, ph, lh, masks)

    @staticmethod
    def _is_post(w: _Window, ref: Ref) -> bool:
        return w.tape.recs[ref[1]].region == "post"

    def _sample_before(self) -> dict[str, Any]:
        return {
            "params": {n: p.detach().clone() for n, p in self.model.named_parameters()},
            "buffers": {n: b.detach().clone() for n, b in self.model.named_buffers()},
            "grads": {
                n: p.grad.detach().clone()
                for n, p in self.model.named_parameters()
                if p.grad is not None
            },
        }

    def _take_sample(
        self, w: _Window, before: dict[str, Any], ph: str, lh: str, masks: list[int]
    ) -> None:
        tape = w.tape
        assert tape.loss is not None
        loss_t = w.tensor(tape.loss)
        s: dict[str, np.ndarray] = {}
        for name, t in w.input_tensors.items():
            s[f"input/{name}"] = _np(t)
        for k, t in enumerate(w.target_tensors):
            s[f"target/{'target' if k == 0 else f'target_{k}'}"] = _np(t)
        for k, rec_index in enumerate(masks):
            outs = w.rec_out[rec_index]
            m = outs[1] if len(outs) > 1 and outs[1].dtype == torch.bool else outs[0] != 0
            s[f"mask/{k}"] = _np(m)
        for role, t in w.output_tensors.items():
            s[f"output/{role}"] = _np(t)
        s["loss"] = _np(loss_t)
        params = dict(self.model.named_parameters())
        trainable = [n for n, p in params.items() if p.requires_grad]
        if w.saw_backward:
            for n in trainable:
                g = params[n].grad
                if g is None:
                    continue
                g = g.detach()
                if n in before["grads"]:
                    g = g - before["grads"][n]
                s[f"grad/{n}"] = _np(g)
        elif loss_t.requires_grad:
            grads = torch.autograd.grad(
                loss_t, [params[n] for n in trainable], retain_graph=True, allow_unused=True
            )
            for n, g in zip(trainable, grads, strict=True):
                if g is not None:
                    s[f"grad/{n}"] = _np(g)
        for n, t in before["params"].items():
            s[f"param/{n}"] = _np(t)
        for n, t in before["buffers"].items():
            s[f"buffer/{n}"] = _np(t)
        buffers = dict(self.model.named_buffers())
        for n, _ref in tape.buffer_updates:
            s[f"update/{n}"] = _np(buffers[n])
        self._sample = s
        self.log.sample_info = {
            "epoch": w.epoch,
            "batch": w.batch,
            "phase": w.phase,
            "prediction": ph,
            "loss": lh,
            "masks": len(masks),
            "grads_from": "backward" if w.saw_backward else "autograd.grad",
        }


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy().copy()


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
