"""The TensorFlow/Keras listener for eager training loops (GradientTape).

An op callback (tensorflow.python.framework.op_callbacks) sees every eager op
inside a batch window. Layer calls are wrapped while the listener lives, to
know the module path of each op and where the model's forward starts and
ends. Variables are read through ReadVariableOp on their handles: parameters
(trainable) and buffers (not trainable); Keras' seed-generator state is RNG
state, and everything computed from it is the dropout mask's randomness.

Rules as in the PyTorch listener: no numerics change (the callback only
looks), fail open (an error drops that batch's record), one fingerprint per
batch and IR only for new ones. Ops built while tracing a tf.function are not
recorded here: ``tracelog.keras.TracelogCallback`` replays the first batch of
each traced step eagerly instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
from collections.abc import Iterator
from typing import Any

import numpy as np

from tracelog.adapters.base import ListenerBase
from tracelog.adapters.builder import Builder, NotSupported
from tracelog.adapters.tape import ConstInfo, Rec, Ref, Tape, TArg, symbolic_shape
from tracelog.ir import array_digest
from tracelog.log import TraceLog

from .batch_dims import exact_batch_dims
from .rules import TF_OPS

logger = logging.getLogger("tracelog")

# ops that only move variables around or keep TF's books
_BOOKKEEPING = {"VarHandleOp", "NoOp", "VarIsInitializedOp", "DestroyResourceOp"}
# ops whose outputs are random
_RANDOM = {
    "StatelessRandomUniformV2",
    "StatelessRandomNormalV2",
    "StatelessRandomGetKeyCounter",
    "RandomUniform",
    "RandomStandardNormal",
}


def _np(t: Any) -> np.ndarray:
    return np.asarray(t.numpy() if hasattr(t, "numpy") else t)


def _dtype(t: Any) -> str:
    return str(t.dtype.name)


def _is_seed(path: str) -> bool:
    return "seed_generator" in path


def _norm_attr(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, (list, tuple)):
        return tuple(_norm_attr(x) for x in v)
    if hasattr(v, "name") and hasattr(v, "as_numpy_dtype"):  # a tf.DType
        return str(v.name)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


class _Window:
    def __init__(self, listener: TFListener, epoch: int, batch: int) -> None:
        self.listener = listener
        self.epoch, self.batch = epoch, batch
        self.phase = "eval"
        self.tape = Tape()
        self.refs: dict[int, Ref] = {}
        self.taint: set[Ref] = set()
        self.model_refs: set[Ref] = set()  # computed from data, parameters or buffers
        self.keep: list[Any] = []
        self.rec_out: list[list[Any]] = []
        self.rng: dict[Ref, Any] = {}
        self.stack: list[tuple[str, str]] = []
        self.root_depth = 0
        self.root_calls = 0
        self.root_done = False
        self.recording = True
        self.error: str | None = None
        self.last_scalar: Ref | None = None
        self.explicit_loss: Ref | None = None
        self.input_tensors: dict[str, Any] = {}
        self.output_tensors: dict[str, Any] = {}
        self.target_tensors: list[Any] = []
        self.buffer_values: dict[str, Ref] = {}

    def fail(self, e: BaseException) -> None:
        if self.listener.strict:
            raise e
        self.recording = False
        self.error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]

    # -- layer calls ---------------------------------------------------------------
    def enter(self, path: str, tname: str, is_root: bool, args: tuple, kwargs: dict) -> None:
        if is_root:
            if self.root_depth == 0:
                self.root_calls += 1
                if self.root_calls == 1:
                    self.phase = "train" if kwargs.get("training") else "eval"
                    self._bind_inputs(args)
            self.root_depth += 1
        self.stack.append((path, tname))

    def exit(self, is_root: bool, output: Any) -> None:
        if self.stack:
            self.stack.pop()
        if is_root:
            self.root_depth -= 1
            if self.root_depth == 0 and self.root_calls == 1:
                if hasattr(output, "dtype"):
                    ref = self.refs.get(id(output))
                    if ref is not None:
                        self.tape.outputs.append(("prediction", ref))
                        self.output_tensors["prediction"] = output
                self.root_done = True

    def _bind_inputs(self, args: tuple) -> None:
        tensors = [a for a in args if hasattr(a, "dtype") and hasattr(a, "shape")]
        for k, t in enumerate(tensors):
            name = "x" if k == 0 else f"x_{k}"
            if self.tape.batch_size is None and len(t.shape) >= 1:
                self.tape.batch_size = int(t.shape[0])
            ref: Ref = ("i", name)
            self.refs[id(t)] = ref
            self.taint.add(ref)
            self.keep.append(t)
            self.input_tensors[name] = t
            shape = symbolic_shape(tuple(t.shape), self.tape.batch_size, True)
            self.tape.inputs[name] = TArg(ref, _dtype(t), shape)

    # -- ops --------------------------------------------------------------------------
    def on_op(self, op_type: Any, inputs: tuple, attrs: tuple, outputs: tuple, graph: Any) -> None:
        if isinstance(op_type, bytes):
            op_type = op_type.decode()
        if graph is not None:
            raise NotSupported(
                "ops built while tracing a tf.function are not recorded; run the batch eagerly "
                "(keras.TracelogCallback replays model.fit's traced steps eagerly)"
            )
        if op_type in _BOOKKEEPING:
            return
        variables = self.listener._handles
        if op_type == "ReadVariableOp":
            path = variables.get(id(inputs[0]))
            if path is not None and outputs:
                v = self.listener._variables[path]
                if _is_seed(path):
                    ref: Ref = ("r", f"seed:{path}")
                elif path in self.buffer_values:
                    ref = self.buffer_values[path]  # read after an assign in this window
                else:
                    ref = ("p", path) if v.trainable else ("b", path)
                self.refs[id(outputs[0])] = ref
                self.keep.append(outputs[0])
                if ref[0] == "r":
                    self.rng[ref] = outputs[0]
            return
        if op_type in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"):
            path = variables.get(id(inputs[0]))
            if path is None or _is_seed(path) or not self._in_model():
                return
            if self.listener._variables[path].trainable:
                return  # the optimizer's update: in neither graph
            if op_type != "AssignVariableOp":
                raise NotSupported(f"{op_type} on a model variable")
            ref = self.refs.get(id(inputs[1]))
            if ref is not None and ref[0] == "o":
                self.buffer_values[path] = ref
            return
        if not self._in_model():
            return
        region = "pred" if self.root_depth > 0 and self.root_calls == 1 else "post"
        in_refs = [self.refs.get(id(t)) for t in inputs]
        from_rng = any(r is not None and r[0] == "r" for r in in_refs)
        only_rng = not any(
            r in self.model_refs or (r is not None and r[0] in "ipbt") for r in in_refs
        )
        if op_type in _RANDOM or (from_rng and only_rng):
            # the dropout mask's randomness: seed arithmetic, uniform draws, the
            # keep test; an op that mixes it with data (SelectV2) is recorded
            for k, t in enumerate(outputs):
                r: Ref = ("r", len(self.rng), k)
                self.refs[id(t)] = r
                self.rng[r] = t
                self.keep.append(t)
            return
        if region == "post" and not any(
            r is not None and r[0] in ("i", "p", "b", "o") for r in in_refs
        ):
            return  # data preparation after the forward: its results meet the loss as targets
        batch = self.tape.batch_size
        tainted = False
        args = []
        for t in inputs:
            targ = self._targ(t, region)
            tainted = tainted or targ.ref in self.taint
            args.append(targ)
        index = len(self.tape.recs)
        targs = []
        from_model = any(a.ref in self.model_refs or a.ref[0] in "ipbt" for a in args)
        for k, t in enumerate(outputs):
            ref = ("o", index, k)
            if tainted:
                self.taint.add(ref)
            if from_model:
                self.model_refs.add(ref)
            self.refs[id(t)] = ref
            self.keep.append(t)
            targs.append(TArg(ref, _dtype(t), symbolic_shape(tuple(t.shape), batch, tainted)))
        self.rec_out.append(list(outputs))
        names = attrs[0::2] if attrs else ()
        values = attrs[1::2] if attrs else ()
        kwargs = tuple(sorted((str(n), _norm_attr(v)) for n, v in zip(names, values, strict=True)))
        module = self.stack[-1] if self.stack else ("", "")
        self.tape.recs.append(
            Rec(
                index,
                f"tf.{op_type}",
                region,
                module,
                tuple(args),
                kwargs,
                tuple(targs),
                len(outputs),
                tainted,
                func=(op_type, attrs),  # to execute it again (adapters/tensorflow/batch_dims.py)
            )
        )
        if region == "post":
            for k, t in enumerate(outputs):
                if len(t.shape) == 0 and t.dtype.is_floating:
                    self.last_scalar = ("o", index, k)
                    break

    def _in_model(self) -> bool:
        return (self.root_depth > 0 and self.root_calls == 1) or self.root_done

    def _targ(self, t: Any, region: str) -> TArg:
        ref = self.refs.get(id(t))
        batch = self.tape.batch_size
        if ref is None:
            if region == "post" and len(t.shape) >= 1 and batch is not None and t.shape[0] == batch:
                ref = ("t", len(self.tape.targets))
                self.taint.add(ref)
                self.tape.targets.append(
                    TArg(ref, _dtype(t), symbolic_shape(tuple(t.shape), batch, True))
                )
                self.target_tensors.append(t)
            elif region == "post" and self._is_batch_size(t):
                ref = ("n", str(t.dtype.name), len(t.shape))
                self.taint.add(ref)
            else:
                arr = _np(t)
                ref = ("c", len(self.tape.consts))
                digest = array_digest(
                    str(arr.dtype), arr.shape, np.require(arr, requirements="C").tobytes()
                )
                self.tape.consts.append(ConstInfo(t, digest))
            self.refs[id(t)] = ref
            self.keep.append(t)
        return TArg(ref, _dtype(t), symbolic_shape(tuple(t.shape), batch, ref in self.taint))

    def _is_batch_size(self, t: Any) -> bool:
        """A one-element constant equal to the batch size, met in the loss:
        Keras' mean reduction divides by the number of samples, computed from
        static shapes before it reaches TensorFlow."""
        batch = self.tape.batch_size
        if batch is None or batch < 2 or int(np.prod(t.shape)) != 1:
            return False
        return float(_np(t).reshape(-1)[0]) == float(batch)

    def tensor(self, ref: Ref) -> Any:
        if ref[0] == "o":
            return self.rec_out[ref[1]][ref[2]]
        raise KeyError(ref)


class TFListener(ListenerBase):
    """Records the algebra of each training batch of a Keras model (TensorFlow
    backend) run eagerly: ``with listener.batch(), tf.GradientTape() as tape:``."""

    def __init__(
        self, model: Any, log_dir: str | os.PathLike[str], *, strict: bool = False
    ) -> None:
        import tensorflow as tf
        from tensorflow.python.framework import op_callbacks

        self._tf = tf
        self._op_callbacks = op_callbacks
        self.model = model
        self.log_dir = log_dir
        self.strict = strict
        log = TraceLog(
            {
                "name": "tensorflow",
                "version": tf.__version__,
                "keras": _keras_version(),
                "device": "cpu" if not tf.config.list_logical_devices("GPU") else "gpu",
                "python": platform.python_version(),
                "mode": "eager",
                "notes": "Keras 3 layers as TensorFlow ops; NHWC ops recorded as NCHW ONNX ops between transposes",
            }
        )
        super().__init__(log)
        self._variables = {v.path: v for v in model.variables}
        self._handles = {id(v.value.handle): v.path for v in model.variables}
        self._window: _Window | None = None
        self._cache: dict[Any, tuple[str, str | None, list[int]]] = {}
        self._sample: dict[str, np.ndarray] | None = None
        # what the last window counted: (prediction hash, loss hash) or the reason it was not
        self.last_counted: tuple[str, str | None] | str | None = None
        self._unwrap: list[tuple[Any, Any]] = []
        layers = [model] + list(model._flatten_layers(include_self=False, recursive=True))
        for layer in layers:
            self._wrap(layer, layer is model)
        if hasattr(model, "_compute_loss"):  # Keras' train_step: the loss it differentiates
            original = model._compute_loss

            def compute_loss(*args: Any, **kwargs: Any) -> Any:
                loss = original(*args, **kwargs)
                w = self._window
                if w is not None and w.recording:
                    ref = w.refs.get(id(loss))
                    if ref is not None and ref[0] == "o":
                        w.explicit_loss = ref
                return loss

            model._compute_loss = compute_loss
            self._unwrap.append((model, original, "_compute_loss"))

    def _wrap(self, layer: Any, is_root: bool) -> None:
        original = layer.call
        path = "" if is_root else str(getattr(layer, "path", None) or layer.name)
        tname = type(layer).__name__

        def call(*args: Any, **kwargs: Any) -> Any:
            w = self._window
            if w is None or not w.recording:
                return original(*args, **kwargs)
            if is_root:
                # NumPy data would become a tensor inside each first layer, out of
                # sight; as a tensor here (what Keras does anyway) it is the input
                args = tuple(
                    self._tf.convert_to_tensor(a) if isinstance(a, np.ndarray) else a for a in args
                )
            try:
                w.enter(path, tname, is_root, args, kwargs)
            except Exception as e:
                w.fail(e)
            out = original(*args, **kwargs)
            if w.recording:
                try:
                    w.exit(is_root, out)
                except Exception as e:
                    w.fail(e)
            return out

        layer.call = call
        self._unwrap.append((layer, original, "call"))

    # -- public API ----------------------------------------------------------------------
    def count_traced(self, phase: str, counted: tuple[str, str | None] | str) -> None:
        """Count a batch run by a traced function whose first batch was recorded
        (``counted`` is what that recording counted, or why it failed)."""
        batch = self._next_batch(phase)
        if isinstance(counted, str):
            self._count_unrecorded(phase, self.epoch, batch, counted)
        else:
            self.log.count(phase, counted[0], counted[1], self.epoch, batch)

    @contextlib.contextmanager
    def batch(self, *, epoch: int | None = None) -> Iterator[TFListener]:
        self._open_batch(epoch)
        w = _Window(self, self.epoch, -1)
        before = None
        grad_tape = None
        if self._sample is None:
            before = {p: _np(v.value) for p, v in self._variables.items() if not _is_seed(p)}
            grad_tape = self._tf.GradientTape(watch_accessed_variables=True)
            grad_tape.__enter__()
        self._window = w

        def callback(
            op_type, inputs, attrs, outputs, op_name=None, graph=None
        ):  # noqa: ANN001, ANN202
            if w.recording:
                try:
                    w.on_op(op_type, inputs, attrs, outputs, graph)
                except Exception as e:  # fail open
                    w.fail(e)
            return None

        self._op_callbacks.add_op_callback(callback)
        raised: BaseException | None = None
        try:
            yield self
        except BaseException as e:
            raised = e
            raise
        finally:
            self._op_callbacks.remove_op_callback(callback)
            self._window = None
            if grad_tape is not None:
                grad_tape.__exit__(None, None, None)
            w.batch = self._next_batch(w.phase)  # the phase is known once the model ran
            if raised is not None:
                w.recording = False
                w.error = f"the batch raised {type(raised).__name__}"
            self._finish(w, before, grad_tape)

    def loss(self, t: Any) -> Any:
        """Mark the loss of this batch (when it is not the last scalar computed)."""
        w = self._window
        if w is None:
            raise RuntimeError("listener.loss() must be called inside listener.batch()")
        ref = w.refs.get(id(t))
        if ref is None or ref[0] != "o":
            w.fail(ValueError("listener.loss() got a tensor that was not computed in this batch"))
        else:
            w.explicit_loss = ref
        return t

    def close(self) -> TraceLog:
        if self._closed:
            return self.log
        self._closed = True
        for obj, original, attr_name in self._unwrap:
            setattr(obj, attr_name, original)
        self._unwrap.clear()
        self.log.model = {
            "class": type(self.model).__name__,
            "params": [
                {
                    "name": p,
                    "dtype": str(v.dtype),
                    "shape": list(v.shape),
                    "trainable": bool(v.trainable),
                }
                for p, v in self._variables.items()
                if v.trainable
            ],
            "buffers": [
                {"name": p, "dtype": str(v.dtype), "shape": list(v.shape)}
                for p, v in self._variables.items()
                if not v.trainable and not _is_seed(p)
            ],
        }
        weights = {p: _np(v.value) for p, v in self._variables.items() if not _is_seed(p)}
        self.log.write(self.log_dir, weights, self._sample)
        return self.log

    # -- internals -------------------------------------------------------------------------
    def _finish(self, w: _Window, before: dict[str, np.ndarray] | None, grad_tape: Any) -> None:
        try:
            if w.recording:
                self._record(w, before, grad_tape)
        except Exception as e:
            if self.strict:
                raise
            w.recording = False
            w.error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
        if not w.recording:
            self.last_counted = w.error or "unknown error"
            self._count_unrecorded(w.phase, w.epoch, w.batch, w.error)

    def _record(self, w: _Window, before: dict[str, np.ndarray] | None, grad_tape: Any) -> None:
        if w.root_calls == 0:
            raise RuntimeError("the model was not called inside the batch window")
        tape = w.tape
        loss = w.explicit_loss or w.last_scalar
        tape.loss = loss
        for path, ref in sorted(w.buffer_values.items()):
            tape.buffer_updates.append((path, ref))
        fp = tape.fingerprint()
        cached = self._cache.get(fp)
        if cached is None:
            trainable = {p: bool(v.trainable) for p, v in self._variables.items()}
            # exact batch dims from a replay with one more sample; the guess if it fails
            exact = exact_batch_dims(tape, self._sources(w))
            builder = Builder(exact or tape, trainable, self.log.constants, TF_OPS, _np)
            builder.convert()
            pred, loss_graph, masks = builder.graphs()
            ph = self.log.add_graph(pred)
            lh = self.log.add_graph(loss_graph) if loss_graph is not None else None
            cached = self._cache[fp] = (ph, lh, masks)
        ph, lh, masks = cached
        self.log.count(w.phase, ph, lh, w.epoch, w.batch)
        self.last_counted = (ph, lh)
        if before is not None and lh is not None and w.phase == "train" and loss is not None:
            self._take_sample(w, before, grad_tape, ph, lh, masks)

    def _sources(self, w: _Window) -> dict[Ref, Any]:
        """The tensors behind the tape's refs that are not op outputs."""
        src: dict[Ref, Any] = dict(w.rng)
        for name, t in w.input_tensors.items():
            src[("i", name)] = t
        for k, t in enumerate(w.target_tensors):
            src[("t", k)] = t
        for k, c in enumerate(w.tape.consts):
            src[("c", k)] = c.tensor
        for path, v in self._variables.items():
            src[("p" if v.trainable else "b", path)] = v.value
        return src

    def _take_sample(
        self,
        w: _Window,
        before: dict[str, np.ndarray],
        grad_tape: Any,
        ph: str,
        lh: str,
        masks: list[int],
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
            cond = tape.recs[rec_index].args[0]
            s[f"mask/{k}"] = _np(w.rng[cond.ref]).astype(bool)
        for role, t in w.output_tensors.items():
            s[f"output/{role}"] = _np(t)
        s["loss"] = _np(loss_t)
        trainable = [(p, v) for p, v in self._variables.items() if v.trainable]
        grads = grad_tape.gradient(loss_t, [v.value for _, v in trainable])
        for (p, _), g in zip(trainable, grads, strict=True):
            if g is not None:
                s[f"grad/{p}"] = _np(self._tf.convert_to_tensor(g))
        for p, arr in before.items():
            kind = "param" if self._variables[p].trainable else "buffer"
            s[f"{kind}/{p}"] = arr
        for p, _ref in tape.buffer_updates:
            s[f"update/{p}"] = _np(self._variables[p].value)
        self._sample = s
        self.log.sample_info = {
            "epoch": w.epoch,
            "batch": w.batch,
            "phase": w.phase,
            "prediction": ph,
            "loss": lh,
            "masks": len(masks),
            "grads_from": "GradientTape",
        }


def _keras_version() -> str:
    try:
        import keras

        return str(keras.__version__)
    except ImportError:  # pragma: no cover
        return ""
