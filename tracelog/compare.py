"""Compare two independently written implementations of one model: a PyTorch
model and its hand-written Keras port, say, each recorded for a batch.

Each log's sample pair (prediction and loss graph) is brought to one normal
form, a sequence of the ops that mean something, in execution order:

- layout ops (Transpose, Identity, Reshape, Squeeze, Unsqueeze) leave the
  sequence; each value remembers how it is laid out relative to its logical,
  channels-first form (``perm``), and a flatten remembers the order in which
  it reads that form (``order``), which the dense layer after it inherits;
- Gemm and MatMul(+Add of a parameter) are one ``Linear`` whose weight is
  (in, out); a Conv's bias is its own or the Add of a parameter after it;
- a parameter's path to its op (a Keras kernel's Transpose to OIHW, a bias's
  Reshape/Squeeze) is a list of steps, so that A's weights map onto B's by
  going to the canonical form and back, and B's gradients onto A's;
- attributes are compared with ONNX's defaults filled in, axes made
  logical, a negative NLL ignore_index (it never matches a class) dropped,
  and a loss summed then divided by the batch size read as a mean.

Where the sequences agree, both graphs run on A's recorded batch in float64
(each log's own JAX program: ``_value_and_grads``), B with A's parameters
mapped onto its own, and predictions, loss and gradients are compared within
``RTOL`` of each output's largest magnitude. ``tracelog.compare(a, b)`` is
:func:`compare`.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracelog.errors import LogError
from tracelog.ir import ConstData, Graph, Node
from tracelog.log import TraceLog
from tracelog.ops import OPS, TRACELOG_DOMAIN, is_random, traits_of
from tracelog.sample import input_key, loss_mask_key, mask_key, target_key

FORMAT = "tracelog-compare"
VERSION = 1
SCHEMA_FILE = Path(__file__).with_name("compare.schema.json")
# float64 rounding, with room for a network's depth (the translation check's
# TRANSLATION_RTOL); a wrong mapping or a different function is off by far more
RTOL = 1e-9

_LAYOUT = {"Transpose", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}
# ops with a kernel window: strides, dilations and pads default as ONNX says
_WINDOWED = {"MaxPool", "AveragePool", "Conv", "ConvTranspose"}
# ONNX defaults of the attributes a recording may leave out
_DEFAULTS: dict[str, dict[str, Any]] = {
    "Softmax": {"axis": -1},
    "LogSoftmax": {"axis": -1},
    "NegativeLogLikelihoodLoss": {"reduction": "mean"},
    "SoftmaxCrossEntropyLoss": {"reduction": "mean"},
    "Gelu": {"approximate": "none"},
    "MaxPool": {"ceil_mode": 0, "storage_order": 0},
    "AveragePool": {"ceil_mode": 0, "count_include_pad": 0},
    "Conv": {"group": 1},
    "BatchNormalization": {"epsilon": 1e-5, "momentum": 0.9},
    "LayerNormalization": {"axis": -1, "epsilon": 1e-5},
}
_IGNORED_ATTRS = {"channels_last", "auto_pad", "training_mode", "stash_type"}

# Element-wise chains are compared by meaning: run on PROBE, in float64, and
# named where they match an activation of NAMED (a Keras GELU written as
# 0.5 * x * (1 - erf(-x * 0.7071...)) is PyTorch's Gelu).
PROBE = np.linspace(-4.0, 4.0, 81)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)))


_UNARY: dict[str, Callable[[np.ndarray, dict[str, Any]], np.ndarray]] = {
    "Identity": lambda x, a: x,
    "Relu": lambda x, a: np.maximum(x, 0.0),
    "Tanh": lambda x, a: np.tanh(x),
    "Sigmoid": lambda x, a: _sigmoid(x),
    "Exp": lambda x, a: np.exp(x),
    "Log": lambda x, a: np.log(x),
    "Sqrt": lambda x, a: np.sqrt(x),
    "Abs": lambda x, a: np.abs(x),
    "Neg": lambda x, a: -x,
    "Reciprocal": lambda x, a: 1.0 / x,
    "Erf": lambda x, a: _erf(x),
    "Softplus": lambda x, a: np.logaddexp(0.0, x),
    "Sin": lambda x, a: np.sin(x),
    "Cos": lambda x, a: np.cos(x),
    "LeakyRelu": lambda x, a: np.where(x >= 0, x, float(a.get("alpha", 0.01)) * x),
    "Celu": lambda x, a: _celu(x, float(a.get("alpha", 1.0))),
    "Elu": lambda x, a: _celu(x, float(a.get("alpha", 1.0))),
    "Gelu": lambda x, a: _gelu(x, str(a.get("approximate", "none"))),
    "SiLU": lambda x, a: x * _sigmoid(x),
    "Log1p": lambda x, a: np.log1p(x),
    "Expm1": lambda x, a: np.expm1(x),
}
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Pow": np.power,
    "Max": np.maximum,
    "Min": np.minimum,
}


def _apply(n: Node, args: list[Any]) -> np.ndarray:
    """n on PROBE-valued arguments (and scalar constants)."""
    with np.errstate(all="ignore"):
        if n.op == "Clip":
            lo, hi = (args + [None, None])[1:3]
            return np.clip(args[0], -np.inf if lo is None else lo, np.inf if hi is None else hi)
        if n.op in _UNARY:
            return _UNARY[n.op](np.asarray(args[0], np.float64), dict(n.attrs))
        values = args[0]
        for other in args[1:]:  # Max and Min take any number
            values = _BINARY[n.op](values, other)
        return np.asarray(values)


def _celu(x: np.ndarray, alpha: float) -> np.ndarray:
    return np.asarray(np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0) / alpha)))


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return np.asarray(0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))))
    return np.asarray(0.5 * x * (1 + _erf(x / math.sqrt(2))))


NAMED: list[tuple[str, dict[str, Any]]] = [
    ("Relu", {}),
    ("Tanh", {}),
    ("Sigmoid", {}),
    ("SiLU", {}),
    ("Gelu", {"approximate": "none"}),
    ("Gelu", {"approximate": "tanh"}),
    ("Elu", {"alpha": 1.0}),
    ("Softplus", {}),
]


@dataclass(frozen=True)
class Step:
    """One step from a raw parameter towards its canonical form."""

    kind: str  # transpose | reshape | rows
    arg: tuple[int, ...]
    before: tuple[int, ...] = ()  # reshape: the shape it had


def to_canonical(x: np.ndarray, steps: tuple[Step, ...]) -> np.ndarray:
    for s in steps:
        if s.kind == "transpose":
            x = np.transpose(x, s.arg)
        elif s.kind == "reshape":
            x = np.reshape(x, s.arg)
        else:  # rows: raw row j is canonical row arg[j]
            out = np.empty_like(x)
            out[list(s.arg)] = x
            x = out
    return x


def from_canonical(x: np.ndarray, steps: tuple[Step, ...]) -> np.ndarray:
    for s in reversed(steps):
        if s.kind == "transpose":
            x = np.transpose(x, np.argsort(s.arg))
        elif s.kind == "reshape":
            x = np.reshape(x, s.before)
        else:
            x = x[list(s.arg)]
    return x


@dataclass(frozen=True)
class ParamUse:
    role: str  # weight, bias, or the op's input name (scale, input_mean, ...)
    name: str
    shape: tuple[int, ...]  # canonical
    raw_shape: tuple[int, ...]
    steps: tuple[Step, ...]


@dataclass
class Op:
    """One meaningful op of the normal form."""

    graph: str  # prediction | loss
    op: str
    attrs: dict[str, Any]
    shape: list[Any]  # logical output shape, "batch" for the batch dim
    path: str
    module_type: str
    params: list[ParamUse] = field(default_factory=list)
    note: str = ""  # shown, not compared: the ops an Elementwise chain was written with
    consts: dict[str, tuple[str, Any]] = field(default_factory=dict)  # attr: (value name, data)

    def facts(self) -> dict[str, Any]:
        """What must agree, field by field."""
        out: dict[str, Any] = {"op": self.op}
        out.update({k: self.attrs[k] for k in sorted(self.attrs)})
        for p in self.params:
            out[f"{p.role} shape"] = list(p.shape)
        out["output shape"] = self.shape
        return out

    def label(self) -> str:
        return f"{self.path or '<root>'} ({self.module_type or '-'})"


@dataclass
class _Act:
    perm: tuple[int, ...]  # actual = transpose(logical, perm)
    order: tuple[int, ...] | None = None  # a flattened value: logical index per position
    op: int | None = None  # the index of the op that made it (through layout ops)


@dataclass
class _Param:
    name: str
    steps: tuple[Step, ...]
    raw_shape: tuple[int, ...]


@dataclass
class _Chain:
    """A value of an element-wise chain not yet read by anything else: the
    chain's values on PROBE, and the activation it started from."""

    entry: str
    act: _Act
    values: np.ndarray
    nodes: tuple[Node, ...]


class _Batch:
    """A value computed from shapes only (a loss's batch size)."""


@dataclass
class _Const:
    value: Any


@dataclass
class NormalForm:
    ops: list[Op]
    inputs: list[tuple[str, _Act]]  # the prediction graph's data inputs
    targets: list[str]  # the loss graph's target inputs
    output: _Act | None  # the prediction's layout
    input_shapes: list[list[Any]]  # the data inputs', logical
    fused: dict[str, list[Fused]] = field(default_factory=dict)  # by graph kind
    masks: list[_Act] = field(default_factory=list)  # the prediction's dropout inputs
    loss_masks: list[_Act] = field(default_factory=list)  # the loss graph's (in its loss function)


def _ints(v: object) -> list[int]:
    """An attribute's ints ([] where it is absent or not a list)."""
    return [int(i) for i in v] if isinstance(v, (list, tuple)) else []


def _ident(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


def _shape(g: Graph, name: str) -> tuple[Any, ...]:
    return tuple(g.values[name].type.shape)


@dataclass(frozen=True)
class Fused:
    """An element-wise chain that computes a named activation: parity runs it
    as that op (Keras writes GELU out with 1/sqrt(2) as a float32 constant,
    1.2e-8 off in a float64 run)."""

    entry: str
    output: str
    op: str
    attrs: dict[str, Any]
    nodes: tuple[Node, ...]


def fused_graph(g: Graph, fused: list[Fused]) -> Graph:
    """`g` with each chain of `fused` replaced by its one op, where no value
    inside the chain is read outside it."""
    g = copy.deepcopy(g)
    for f in fused:
        domain = next((d for d in ("", TRACELOG_DOMAIN) if (d, f.op) in OPS), None)
        if domain is None:  # a name of the comparison (Elu) that no target runs: as written
            continue
        chain = [n for n in g.nodes if any(_same_node(n, m) for m in f.nodes)]
        inner = {o for n in chain for o in n.outputs} - {f.output}
        outside = [n for n in g.nodes if not any(n is c for c in chain)]
        read = {i for n in outside for i in n.inputs} | {o.name for o in g.outputs}
        if len(chain) != len(f.nodes) or inner & read:
            continue
        last = chain[-1]
        one = Node(
            f.op, [f.entry], [f.output], dict(f.attrs), domain, last.module, last.module_type
        )
        at = g.nodes.index(last)
        g.nodes = (
            [n for n in g.nodes[:at] if n not in chain]
            + [one]
            + [n for n in g.nodes[at + 1 :] if n not in chain]
        )
        for name in inner:
            g.values.pop(name, None)
    return g


def _same_node(a: Node, b: Node) -> bool:
    return a.op == b.op and a.inputs == b.inputs and a.outputs == b.outputs


class _Normaliser:
    def __init__(self, g: Graph, kind: str, ops: list[Op], given: dict[str, _Act]) -> None:
        self.g, self.kind, self.ops = g, kind, ops
        self.fused: list[Fused] = []
        self.masks: list[_Act] = []  # each random node's input layout, in node order
        self.state: dict[str, Any] = {}
        for v in g.values.values():
            if v.kind in ("param", "buffer"):
                self.state[v.name] = _Param(v.name, (), tuple(int(d) for d in v.type.shape))
            elif v.kind == "const":
                self.state[v.name] = _Const(v.const.data if v.const else None)
        for v in g.inputs:
            self.state[v.name] = given.get(v.name) or _Act(self._input_perm(v.name))

    def _input_perm(self, name: str) -> tuple[int, ...]:
        """A data input read only through one Transpose (Keras NHWC data into an
        NCHW Conv) is laid out by that Transpose's inverse."""
        rank = len(_shape(self.g, name))
        users = [n for n in self.g.nodes if name in n.inputs]
        perms = {tuple(_ints(n.attrs.get("perm"))) for n in users if n.op == "Transpose"}
        if users and len(perms) == 1 and all(n.op == "Transpose" for n in users):
            return tuple(int(i) for i in np.argsort(list(next(iter(perms)))))
        return _ident(rank)

    def run(self) -> None:
        self.producers = self.g.producers()
        read = {i for n in self.g.nodes for i in n.inputs}
        for n in self.g.nodes:
            if not any(isinstance(self.state.get(i), (_Act, _Chain)) for i in n.inputs) and not any(
                o in read for o in n.outputs
            ):
                continue  # buffer bookkeeping (num_batches_tracked += 1): no data flows in or on
            if self._chained(n):
                continue
            for i in n.inputs:
                self._settle(i)
            self._node(n)
        for o in self.g.outputs:
            self._settle(o.name)

    def _chained(self, n: Node) -> bool:
        """Extend an element-wise chain by n, where n is an op of _UNARY or
        _BINARY (or Clip) on one activation's chain and scalar constants."""
        if n.op not in _UNARY and n.op not in _BINARY and n.op != "Clip" or len(n.outputs) != 1:
            return False
        args: list[Any] = []
        entry: tuple[str, _Act] | None = None
        for i in n.inputs:
            s = self.state.get(i)
            if isinstance(s, _Chain):
                here: tuple[str, _Act] = (s.entry, s.act)
                args.append(s.values)
            elif isinstance(s, _Act) and _shape(self.g, i) == _shape(self.g, n.outputs[0]):
                here = (i, s)
                args.append(PROBE)
            elif isinstance(s, _Const) and _scalar(s.value) is not None:
                args.append(_scalar(s.value))
                continue
            else:
                return False
            if entry is not None and entry[0] != here[0]:
                return False
            entry = here
        if entry is None:
            return False
        values = _apply(n, args)
        nodes: list[Node] = []
        for chain in (s for s in map(self.state.get, n.inputs) if isinstance(s, _Chain)):
            nodes += [m for m in chain.nodes if all(m is not k for k in nodes)]
        self.state[n.outputs[0]] = _Chain(entry[0], entry[1], np.asarray(values), (*nodes, n))
        return True

    def _settle(self, name: str) -> None:
        """A chain value read by an op outside the chain: one op, named by
        what it computes."""
        s = self.state.get(name)
        if not isinstance(s, _Chain):
            return
        op, attrs = _named(s.values)
        node = self.producers[name]  # the chain's last op names it (Keras' Activation)
        shape = self._logical(name, _Act(s.act.perm))
        self._emit(node, op, attrs, shape, [])
        if op == "Elementwise":
            self.ops[-1].note = ", ".join(m.op for m in s.nodes)
        elif len(s.nodes) > 1 or s.nodes[0].op != op:
            self.fused.append(Fused(s.entry, name, op, attrs, s.nodes))
        self.state[name] = _Act(s.act.perm, s.act.order, len(self.ops) - 1)

    def _node(self, n: Node) -> None:
        ins = [self.state.get(i) for i in n.inputs]
        out = n.outputs[0] if n.outputs else ""
        acts = [s for s in ins if isinstance(s, _Act)]
        if n.op == "Shape" or (
            not acts
            and not any(isinstance(s, _Param) for s in ins)
            and any(isinstance(s, _Batch) for s in ins)
        ):
            for o in n.outputs:
                self.state[o] = _Batch()
            return
        if n.op in _LAYOUT and ins and isinstance(ins[0], _Param):
            self.state[out] = self._param_step(n, ins[0])
            return
        if n.op in _LAYOUT and ins and isinstance(ins[0], _Act):
            self._layout(n, ins[0])
            return
        if n.op in _LAYOUT and ins and isinstance(ins[0], _Const):
            self.state[out] = _Const(None)
            return
        if n.op == "Where" and isinstance(ins[0], _Batch) and isinstance(ins[2], _Act):
            self.state[out] = ins[2]  # DivNoNan's guard against an empty batch
            return
        if n.op == "Div" and isinstance(ins[0], _Act) and isinstance(ins[1], _Batch):
            self._per_batch(n, ins[0])
            return
        if n.op == "ReduceSum" and isinstance(ins[0], _Act) and self._sums_loss(n, ins[0]):
            return
        if n.op == "Add" and len(acts) == 1 and any(isinstance(s, _Param) for s in ins):
            if self._bias(n, acts[0], next(s for s in ins if isinstance(s, _Param))):
                return
        if n.op in ("Gemm", "MatMul") and isinstance(ins[0], _Act) and isinstance(ins[1], _Param):
            self._linear(n, ins[0], ins[1], ins[2] if len(ins) > 2 else None)
            return
        self._generic(n, ins)

    def _param_step(self, n: Node, p: _Param) -> _Param:
        if n.op == "Transpose":
            perm = tuple(_ints(n.attrs.get("perm")))
            return _Param(p.name, p.steps + (Step("transpose", perm),), p.raw_shape)
        if n.op == "Identity":
            return p
        before = tuple(int(d) for d in _shape(self.g, n.inputs[0]))
        after = tuple(int(d) for d in _shape(self.g, n.outputs[0]))
        return _Param(p.name, p.steps + (Step("reshape", after, before),), p.raw_shape)

    def _layout(self, n: Node, a: _Act) -> None:
        out = n.outputs[0]
        if n.op == "Transpose":
            p = _ints(n.attrs.get("perm"))
            self.state[out] = _Act(tuple(a.perm[i] for i in p), a.order, a.op)
            return
        if n.op == "Identity":
            self.state[out] = a
            return
        before, after = _shape(self.g, n.inputs[0]), _shape(self.g, n.outputs[0])
        kept = [i for i, d in enumerate(before) if d != 1]
        if (
            a.order is None
            and len(before) == len(a.perm)
            and [before[i] for i in kept] == list(after)
        ):
            # only size-1 dims dropped (a flatten after global pooling): no op, same data
            logical = [a.perm[i] for i in kept]
            self.state[out] = _Act(
                tuple(int(r) for r in np.argsort(np.argsort(logical))), None, a.op
            )
            return
        per = [int(d) for d in before[1:] if not isinstance(d, str)]
        if (
            len(before) >= 3
            and len(after) == 2
            and len(per) == len(before) - 1
            and after[1] == math.prod(per)
            and a.order is None
        ):  # a flatten: which logical element each position holds
            logical = [per[i - 1] for i in np.argsort(a.perm)[1:]]
            idx = np.arange(math.prod(per)).reshape(logical)
            order = np.transpose(idx, [i - 1 for i in a.perm[1:]]).ravel()
            self._emit(n, "Flatten", {}, list(after), [])
            self.state[out] = _Act(_ident(2), tuple(int(i) for i in order), len(self.ops) - 1)
            return
        attrs = {} if a.perm == _ident(len(a.perm)) else {"layout": list(a.perm)}
        self._emit(n, "Reshape", attrs, list(after), [])
        self.state[out] = _Act(_ident(len(after)), None, len(self.ops) - 1)

    def _per_batch(self, n: Node, a: _Act) -> None:
        """A value divided by the batch size (Keras' sum_over_batch_size)."""
        op = self.ops[a.op] if a.op is not None else None
        if op is not None and op.attrs.get("reduction") == "sum":
            op.attrs["reduction"] = "mean"
        elif op is self.ops[-1] and op.op == "ReduceSum" and op.attrs.get("axes") == [0]:
            op.op = "ReduceMean"  # a sum over the batch, divided by its size
            prev = self.ops[-2] if len(self.ops) > 1 else None
            if prev is not None and prev.op == "ReduceMean" and prev.shape == ["batch"]:
                # after a mean over the rest (Keras' MSE per sample): one mean over all
                prev.attrs["axes"] = sorted({0, *prev.attrs["axes"]})
                prev.shape = []
                self.ops.pop()
        else:
            self._emit(n, "Div", {"by": "batch size"}, self._logical(n.outputs[0], a), [])
        self.state[n.outputs[0]] = _Act(a.perm, a.order, len(self.ops) - 1)

    def _sums_loss(self, n: Node, a: _Act) -> bool:
        op = self.ops[a.op] if a.op is not None else None
        if op is None or op.op not in ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"):
            return False
        if op.attrs.get("reduction") != "none" or _shape(self.g, n.outputs[0]) != ():
            return False
        op.attrs["reduction"] = "sum"
        op.shape = []
        self.state[n.outputs[0]] = _Act((), None, a.op)
        return True

    def _bias(self, n: Node, a: _Act, p: _Param) -> bool:
        op = self.ops[a.op] if a.op is not None else None
        if (
            op is None
            or op.op not in ("Conv", "Linear")
            or any(u.role == "bias" for u in op.params)
        ):
            return False
        if self.ops[-1] is not op:
            return False
        channels = op.shape[1] if len(op.shape) > 1 else None
        size = math.prod(
            _shape(self.g, [i for i in n.inputs if isinstance(self.state[i], _Param)][0])
        )
        if size != channels:
            return False
        op.params.append(self._use("bias", p, flat=True))
        self.state[n.outputs[0]] = a
        return True

    def _linear(self, n: Node, a: _Act, w: _Param, b: Any) -> None:
        steps = w.steps
        if n.op == "Gemm":
            if n.attrs.get("transA", 0) or n.attrs.get("alpha", 1.0) != 1.0:
                self._generic(n, [a, w, b])
                return
            if n.attrs.get("transB", 0):
                steps += (Step("transpose", (1, 0)),)
        if len(_shape(self.g, n.inputs[1])) != 2:
            self._generic(n, [a, w, b])
            return
        if a.order is not None and a.order != _ident(len(a.order)):
            steps += (Step("rows", a.order),)
        params = [self._use("weight", _Param(w.name, steps, w.raw_shape))]
        if isinstance(b, _Param):
            params.append(self._use("bias", b, flat=True))
        rank = len(_shape(self.g, n.outputs[0]))  # (batch, seq, features) too
        self._emit(n, "Linear", {}, self._logical(n.outputs[0], _Act(_ident(rank))), params)
        self.state[n.outputs[0]] = _Act(_ident(rank), None, len(self.ops) - 1)

    def _use(self, role: str, p: _Param, flat: bool = False) -> ParamUse:
        steps = p.steps
        shape = tuple(to_canonical(np.zeros(p.raw_shape, np.int8), steps).shape)
        if flat and len(shape) != 1:
            steps += (Step("reshape", (math.prod(shape),), shape),)
            shape = (math.prod(shape),)
        return ParamUse(role, p.name, shape, p.raw_shape, steps)

    def _logical(self, name: str, a: _Act) -> list[Any]:
        shape = _shape(self.g, name)
        if len(a.perm) != len(shape):
            return list(shape)
        return [shape[i] for i in np.argsort(a.perm)]

    def _generic(self, n: Node, ins: list[Any]) -> None:
        schema = OPS.get((n.domain, n.op))
        names = [s.rstrip("?*") for s in schema.inputs] if schema else []
        acts = [s for s in ins if isinstance(s, _Act)]
        first = acts[0] if acts else _Act(())
        # a dropout's mask follows its input's layout (_relaid maps A's onto B's)
        elementwise = "elementwise" in traits_of(n) or is_random(n)
        perm = first.perm if elementwise else _ident(len(_shape(self.g, n.outputs[0])))
        rank = len(_shape(self.g, n.inputs[0])) if n.inputs else 0
        attrs = _attrs(n, first.perm, rank)
        reduced: list[int] = []
        if "reduction" in traits_of(n) and len(first.perm) == rank:
            reduced, perm = _reduced(n, ins, first.perm, attrs)
            ins = ins[:1]
        elif not elementwise and first.perm != _ident(len(first.perm)):
            attrs["input layout"] = list(first.perm)
        params = []
        consts: dict[str, tuple[str, Any]] = {}
        for k, s in enumerate(ins):
            role = names[min(k, len(names) - 1)] if names else f"input {k}"
            if isinstance(s, _Param):
                params.append(
                    self._use("weight" if k == 1 and n.op.startswith("Conv") else role, s)
                )
                if n.op == "Conv" and k == 2:
                    params[-1] = self._use("bias", s, flat=True)
            elif isinstance(s, _Const) and s.value is not None:
                attrs[f"input {role}"] = _plain(s.value)
                consts[f"input {role}"] = (n.inputs[k], s.value)
        shape = self._logical(n.outputs[0], _Act(perm)) if n.outputs else []
        if reduced and len(shape) == rank:
            shape = [d for i, d in enumerate(shape) if i not in reduced]
        self._emit(n, n.op, attrs, shape, params)
        self.ops[-1].consts = consts
        if is_random(n):  # its mask is laid out as its input
            self.masks.append(first)
        order = first.order if elementwise else None
        for o in n.outputs:
            self.state[o] = _Act(perm if o == n.outputs[0] else _ident(len(_shape(self.g, o))))
        if n.outputs:
            self.state[n.outputs[0]] = _Act(perm, order, len(self.ops) - 1)

    def _emit(
        self, n: Node, op: str, attrs: dict[str, Any], shape: list[Any], params: list[ParamUse]
    ) -> None:
        shape = [_dim(d) for d in shape]
        self.ops.append(Op(self.kind, op, attrs, shape, n.module, n.module_type, params))


def _reduced(
    n: Node, ins: list[Any], perm: tuple[int, ...], attrs: dict[str, Any]
) -> tuple[list[int], tuple[int, ...]]:
    """A reduction's logical axes (set in attrs, keepdims dropped: the reduced
    dims leave the compared shape whether kept as size 1 or not, as a Flatten
    after keepdims squeezes them) and the layout of its output."""
    rank = len(perm)
    keep = n.attrs.get("keepdims", 1) != 0
    if len(ins) > 1 and isinstance(ins[1], _Const):
        reduced = [int(perm[a % rank]) for a in _ints(ins[1].value)]
    elif (len(ins) < 2 or ins[1] is None) and not n.attrs.get("noop_with_empty_axes", 0):
        reduced = list(range(rank))  # ONNX: no axes, every axis
    else:
        return [], _ident(rank)
    attrs["axes"] = sorted(reduced)
    attrs.pop("keepdims", None)
    left = list(perm) if keep else [p for p in perm if p not in reduced]
    return reduced, tuple(int(r) for r in np.argsort(np.argsort(left)))


def _scalar(v: Any) -> float | None:
    """A constant's value as one float, or None where it is not one number."""
    while isinstance(v, list) and len(v) == 1:
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _named(values: np.ndarray) -> tuple[str, dict[str, Any]]:
    """The activation of NAMED (or LeakyRelu with its slope) an element-wise
    chain computes on PROBE, within float32 rounding of its constants; else
    "Elementwise" with its values at a few points."""
    values = np.broadcast_to(values, PROBE.shape)
    finite = np.abs(values[np.isfinite(values)])
    scale = max(1.0, float(finite.max(initial=0.0)))
    for op, attrs in NAMED:
        want = _UNARY[op](PROBE, attrs)
        if np.allclose(values, want, rtol=0, atol=1e-6 * scale):
            return op, dict(attrs)
    slope = values[0] / PROBE[0]
    leaky = np.where(PROBE >= 0, PROBE, slope * PROBE)
    if 0 < slope < 1 and np.allclose(values, leaky, rtol=0, atol=1e-6 * scale):
        return "LeakyRelu", {"alpha": _plain(float(slope))}
    at = [0, 20, 30, 38, 40, 42, 50, 60, 80]  # x = -4, -2, -1, -0.2, 0, 0.2, 1, 2, 4
    shown = [None if not np.isfinite(values[i]) else float(f"{values[i]:.6g}") for i in at]
    return "Elementwise", {"f(-4,-2,-1,-0.2,0,0.2,1,2,4)": shown}


def _dim(d: Any) -> Any:
    return d if isinstance(d, int) else str(d)


def _attrs(n: Node, perm: tuple[int, ...], rank: int) -> dict[str, Any]:
    """The node's attributes as compared: ONNX defaults filled in, axes
    logical (perm: the input's layout), bookkeeping ones left out."""
    attrs: dict[str, Any] = dict(_DEFAULTS.get(n.op, {}))
    schema = OPS.get((n.domain, n.op))
    if schema:
        attrs.update(dict(schema.defaults))
    explicit = schema.explicit_attrs(n.attrs) if schema else dict(n.attrs)
    attrs.update({k: v for k, v in explicit.items() if k not in _IGNORED_ATTRS})
    k = len(_ints(n.attrs.get("kernel_shape")))
    if k and n.op in _WINDOWED:
        attrs.setdefault("strides", [1] * k)
        attrs.setdefault("dilations", [1] * k)
        attrs.setdefault("pads", [0] * 2 * k)
    if n.op in ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"):
        if int(attrs.get("ignore_index", -1)) < 0:  # never equal to a class index
            attrs.pop("ignore_index", None)
    if "axis" in attrs and rank:
        axis = int(attrs["axis"]) % rank
        attrs["axis"] = int(perm[axis]) if perm and len(perm) == rank else axis
    return {k: _plain(v) for k, v in attrs.items()}


def _plain(v: Any) -> Any:
    if isinstance(v, float) and math.isfinite(v):
        # at float32 precision: Keras stores epsilon=1e-5 as float32, PyTorch as a double
        return float(np.float32(v))
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def normal_form(log: TraceLog) -> NormalForm:
    """The sample pair of `log` as its sequence of meaningful ops."""
    info = log.sample_info
    if not info or "prediction" not in info or "loss" not in info:
        raise LogError("the log has no recorded sample batch to compare")
    pred, loss = log.graph(info["prediction"]), log.graph(info["loss"])
    ops: list[Op] = []
    p = _Normaliser(pred, "prediction", ops, {})
    p.run()
    inputs = [(v.name, p.state[v.name]) for v in pred.inputs]
    given: dict[str, _Act] = {}
    output = None
    for o in pred.outputs:
        s = p.state.get(o.name)
        if isinstance(s, _Act):
            given[o.role] = _Act(s.perm, s.order)
            if o.role == "prediction":
                output = s
    for name, s in inputs:
        given[name] = _Act(s.perm) if isinstance(s, _Act) else _Act(())
    lo = _Normaliser(loss, "loss", ops, given)
    lo.run()
    preds = {o.role for o in pred.outputs}
    data = {v.name for v in pred.inputs}
    targets = [v.name for v in loss.inputs if v.name not in preds and v.name not in data]
    shapes = [
        [_dim(d) for d in p._logical(name, s)] if isinstance(s, _Act) else [] for name, s in inputs
    ]
    fused = {"prediction": p.fused, "loss": lo.fused}
    return NormalForm(ops, inputs, targets, output, shapes, fused, p.masks, lo.masks)


# -- the comparison --------------------------------------------------------------------------


@dataclass
class Difference:
    """The first op where the two normal forms part."""

    graph: str
    index: int  # position in the normal form (prediction ops, then loss ops)
    field: str
    a: Op | None
    b: Op | None
    a_value: Any = None
    b_value: Any = None

    def side(self, op: Op | None, value: Any) -> dict[str, Any] | None:
        if op is None:
            return None
        return {"path": op.path, "module_type": op.module_type, "op": op.op, "value": value}

    def line(self) -> str:
        if self.a is None and self.b is None:
            return (
                f"first difference: {self.field}: A {_fmt(self.a_value)} vs B {_fmt(self.b_value)}"
            )

        def one(tag: str, op: Op | None, value: Any) -> str:
            if op is None:
                return f"{tag} (no op: its {self.graph} graph ends here)"
            shown = "" if self.field == "op" else f" {self.field} {_fmt(value)}"
            note = f" ({op.note})" if op.note else ""
            return f"{tag} {op.label()} {op.op}{note}{shown}"

        return (
            f"first difference ({self.graph} op {self.index + 1}): "
            f"{one('A', self.a, self.a_value)} vs {one('B', self.b, self.b_value)}"
        )


@dataclass
class Pair:
    a: ParamUse
    b: ParamUse
    op: str
    by: str  # structure | mapping
    # max |A's weight mapped onto B - B's own at the sample batch|: 0 where the
    # two models started from the same weights (copied across correctly)
    own_diff: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a.name,
            "b": self.b.name,
            "role": self.a.role,
            "op": self.op,
            "a_shape": list(self.a.raw_shape),
            "b_shape": list(self.b.raw_shape),
            "canonical_shape": list(self.a.shape),
            "matched_by": self.by,
            "own_diff": None if self.own_diff is None else _finite(self.own_diff),
        }


@dataclass
class Row:
    output: str
    max_abs: float
    scale: float
    ok: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "max_abs": _finite(self.max_abs),
            "scale": _finite(self.scale),
            "ok": self.ok,
        }


def _finite(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


@dataclass
class Comparison:
    a_name: str
    b_name: str
    a_about: str
    b_about: str
    ops: int
    difference: Difference | None
    pairs: list[Pair] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    @property
    def structure_equal(self) -> bool:
        return self.difference is None

    @property
    def parity(self) -> bool:
        return self.structure_equal and bool(self.rows) and all(r.ok for r in self.rows)

    @property
    def equal(self) -> bool:
        """Exit 0: the structures agree and so do the numbers."""
        return self.parity

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict, valid against ``compare.schema.json`` (SCHEMA_FILE)."""
        d = self.difference
        return {
            "format": FORMAT,
            "version": VERSION,
            "a": {"log": self.a_name, "about": self.a_about},
            "b": {"log": self.b_name, "about": self.b_about},
            "equal": self.equal,
            "structure": {
                "ops": self.ops,
                "equal": self.structure_equal,
                "first_difference": (
                    None
                    if d is None
                    else {
                        "graph": d.graph,
                        "index": d.index,
                        "field": d.field,
                        "a": d.side(d.a, _jsonable(d.a_value)),
                        "b": d.side(d.b, _jsonable(d.b_value)),
                        "line": d.line(),
                    }
                ),
            },
            "parameters": [p.to_json() for p in self.pairs],
            "parity": (
                None
                if not self.rows
                else {
                    "rtol": RTOL,
                    "ok": self.parity,
                    "rows": [r.to_json() for r in self.rows],
                }
            ),
        }


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def _load(log: TraceLog | str | os.PathLike[str]) -> tuple[TraceLog, str]:
    if isinstance(log, TraceLog):
        return log, str(getattr(log, "_dir", "") or "<log>")
    return TraceLog.load(log), str(log)


def _about(log: TraceLog) -> str:
    fw = log.framework
    return f"{fw.get('name', '?')} {fw.get('version', '')}, model {log.model.get('class', '?')}"


def compare(
    a: TraceLog | str | os.PathLike[str],
    b: TraceLog | str | os.PathLike[str],
    *,
    mapping: dict[str, str] | None = None,
) -> Comparison:
    """Compare log `b` (a second implementation) with log `a`: the first
    structural difference, or, where the structures agree, parity of
    predictions, loss and gradients with B's parameters mapped from A's.
    `mapping` ({A parameter: B parameter}) overrides the structural match."""
    la, a_name = _load(a)
    lb, b_name = _load(b)
    fa, fb = normal_form(la), normal_form(lb)
    result = Comparison(a_name, b_name, _about(la), _about(lb), len(fa.ops), None)
    result.difference = _first_difference(fa, fb)
    if result.difference is not None:
        return result
    result.pairs = _pairs(fa, fb, la, lb, mapping or {})
    result.rows = _parity(la, lb, fa, fb, result.pairs)
    return result


def _first_difference(fa: NormalForm, fb: NormalForm) -> Difference | None:
    for k in range(max(len(fa.ops), len(fb.ops))):
        oa = fa.ops[k] if k < len(fa.ops) else None
        ob = fb.ops[k] if k < len(fb.ops) else None
        if oa is None or ob is None:
            graph = (oa or ob).graph  # type: ignore[union-attr]
            return Difference(graph, k, "op", oa, ob)
        if oa.graph != ob.graph:  # one side's prediction graph ends first
            first = (oa, None) if oa.graph == "prediction" else (None, ob)
            return Difference("prediction", k, "op", *first)
        xa, xb = oa.facts(), ob.facts()
        for key in list(xa) + [k2 for k2 in xb if k2 not in xa]:
            if not _same(xa.get(key), xb.get(key), key.endswith("shape")):
                return Difference(oa.graph, k, key, oa, ob, xa.get(key), xb.get(key))
    if not _same(fa.input_shapes, fb.input_shapes, True):
        return Difference(
            "prediction", 0, "data input shapes", None, None, fa.input_shapes, fb.input_shapes
        )
    return None


def _same(a: Any, b: Any, shape: bool = False) -> bool:
    """Equal facts; in a shape, a symbolic dim other than the batch (a log that
    found the spatial size free, "seq") matches any size."""
    if not (shape and isinstance(a, list) and isinstance(b, list) and len(a) == len(b)):
        return bool(a == b)
    return all(
        _same(x, y, True) if isinstance(x, list) else _same_dim(x, y)
        for x, y in zip(a, b, strict=True)
    )


def _same_dim(x: Any, y: Any) -> bool:
    free = (isinstance(x, str) and x != "batch") or (isinstance(y, str) and y != "batch")
    return bool(x == y) or (free and not isinstance(x, list) and not isinstance(y, list))


def _uses(f: NormalForm) -> list[tuple[Op, ParamUse]]:
    return [(op, u) for op in f.ops for u in op.params]


def _pairs(
    fa: NormalForm, fb: NormalForm, la: TraceLog, lb: TraceLog, mapping: dict[str, str]
) -> list[Pair]:
    b_uses = {u.name: u for _, u in _uses(fb)}
    a_names = {u.name for _, u in _uses(fa)}
    for an, bn in mapping.items():
        if an not in a_names:
            raise LogError(f"--mapping names {an!r}, which no op of A reads")
        if bn not in b_uses:
            raise LogError(f"--mapping maps {an!r} to {bn!r}, which no op of B reads")
    pairs: list[Pair] = []
    seen: set[str] = set()
    for (oa, ua), (_, ub) in zip(_uses(fa), _uses(fb), strict=True):
        if ua.name in seen:
            continue
        seen.add(ua.name)
        by = "structure"
        if ua.name in mapping:
            ub, by = b_uses[mapping[ua.name]], "mapping"
            if ub.shape != ua.shape:
                raise LogError(
                    f"--mapping maps {ua.name!r} (canonical {list(ua.shape)}) to {ub.name!r} "
                    f"(canonical {list(ub.shape)}): the shapes differ"
                )
        pairs.append(Pair(ua, ub, oa.op, by))
    mapped = [p.b.name for p in pairs]
    twice = sorted({n for n in mapped if mapped.count(n) > 1})
    if twice:
        raise LogError(f"B's parameter {twice[0]!r} is mapped from more than one of A's")
    trainable_b = {p["name"] for p in lb.model.get("params", []) if p.get("trainable", True)}
    missing = sorted(trainable_b & set(b_uses) - set(mapped))
    if missing:
        raise LogError(f"no parameter of A maps onto B's {missing[0]!r}")
    return pairs


# -- parity ------------------------------------------------------------------------------


def _program(log: TraceLog) -> types.ModuleType:
    """The log's JAX program, as `tracelog emit --target jax` writes it."""
    from tracelog.emit import targets
    from tracelog.emit.program import build_program
    from tracelog.parity import _module_from_text

    program = build_program(log, targets.get("jax").program, standalone=True)
    return _module_from_text(program, "tracelog_compare")


def _run(
    log: TraceLog,
    f: NormalForm,
    sample: dict[str, np.ndarray],
    params: dict[str, np.ndarray],
    consts: dict[str, Any] | None = None,
) -> Any:
    """Prediction, loss and gradients of `log`'s sample pair on `sample` with
    `params` in place of the recorded trainable parameters, all in float64,
    each chain the normal form named run as its op."""
    info: dict[str, Any] = dict(log.sample_info or {})
    if any(f.fused.values()) or consts:
        log = copy.copy(log)
        log.graphs = dict(log.graphs)
        for kind, chains in f.fused.items():
            g = fused_graph(log.graphs[info[kind]], chains)
            for name, value in (consts or {}).items():
                if name in g.values and g.values[name].const is not None:
                    g.values[name].const = ConstData(value)
            log.graphs[info[kind]] = g
    m = _program(log)
    trainable = [name for name, t, *_ in m.PARAMETERS if t]
    with m._in_float64():
        given = m.sample_params(str(log._dir), float64=True)
        for name, value in params.items():
            given[name] = m._as_param(np.asarray(value, np.float64), True)
        outputs, loss, grads = m._value_and_grads(
            lambda p: m.sample_step(p, sample), given, trainable, jit=False
        )
    return (
        {k: np.asarray(v, np.float64) for k, v in outputs.items()},
        float(np.asarray(loss)),
        {
            n: None if g is None else np.asarray(g, np.float64)
            for n, g in zip(trainable, grads, strict=True)
        },
    )


def _feed_b(
    wide: dict[str, np.ndarray], sb: dict[str, np.ndarray], fa: NormalForm, fb: NormalForm
) -> dict[str, np.ndarray]:
    """A's batch (float64) as B reads it: data inputs in B's layout, targets in
    B's dtype."""
    feed: dict[str, np.ndarray] = {}
    for (na, sta), (nb, stb) in zip(fa.inputs, fb.inputs, strict=True):
        x = np.transpose(wide[input_key(na)], np.argsort(sta.perm))  # A's, logical
        feed[input_key(nb)] = np.ascontiguousarray(np.transpose(x, stb.perm))
    for ta, tb in zip(fa.targets, fb.targets, strict=True):
        key = target_key(tb) if target_key(tb) in sb else input_key(tb)
        src = wide[target_key(ta) if target_key(ta) in wide else input_key(ta)]
        feed[key] = src.astype(sb[key].dtype) if sb[key].dtype.kind != "f" else src
    # A's dropout masks (the prediction's and the loss graph's), each in the layout
    # B's dropout reads: the same units dropped
    for masks_a, masks_b, key_of in (
        (fa.masks, fb.masks, mask_key),
        (fa.loss_masks, fb.loss_masks, loss_mask_key),
    ):
        for k, (ma, mb) in enumerate(zip(masks_a, masks_b, strict=True)):
            if key_of(k) in wide:
                feed[key_of(k)] = _relaid(wide[key_of(k)], ma, mb)
    return feed


def _consts(fa: NormalForm, fb: NormalForm) -> dict[str, Any]:
    """B's constant inputs (a dropout's ratio) that equal A's at float32
    precision, set to A's value: Keras holds 0.3 as float32, 2.4e-8 off the
    0.3 PyTorch scales by, which a float64 run shows."""
    out = {}
    for oa, ob in zip(fa.ops, fb.ops, strict=True):
        for key, (name, value) in ob.consts.items():
            if key in oa.consts and oa.consts[key][1] != value:
                out[name] = oa.consts[key][1]
    return out


def _relaid(x: np.ndarray, a: _Act, b: _Act) -> np.ndarray:
    """x, laid out as A's value `a`, in the layout of B's value `b`."""
    if a.order is not None or b.order is not None:  # flattened: per-position order
        logical = np.empty_like(x)
        logical[:, list(a.order or range(x.shape[1]))] = x
        return np.ascontiguousarray(logical[:, list(b.order or range(x.shape[1]))])
    logical = np.transpose(x, np.argsort(a.perm)) if len(a.perm) == x.ndim else x
    return np.ascontiguousarray(np.transpose(logical, b.perm) if len(b.perm) == x.ndim else x)


def _parity(
    la: TraceLog, lb: TraceLog, fa: NormalForm, fb: NormalForm, pairs: list[Pair]
) -> list[Row]:
    sa = la.sample()
    if len(fa.inputs) != len(fb.inputs) or len(fa.targets) != len(fb.targets):
        raise LogError("the logs' data inputs or targets differ in number")
    wide = {k: (v.astype(np.float64) if v.dtype.kind == "f" else v) for k, v in sa.items()}
    fed = ("input/", "target/", "mask/", "loss_mask/")
    feed_a = {k: v for k, v in wide.items() if k.startswith(fed)}
    sb = lb.sample()
    feed_b = _feed_b(wide, sb, fa, fb)
    weights_a = {p.a.name: wide[f"param/{p.a.name}"] for p in pairs if f"param/{p.a.name}" in wide}
    weights_b = {
        p.b.name: from_canonical(to_canonical(weights_a[p.a.name], p.a.steps), p.b.steps)
        for p in pairs
        if p.a.name in weights_a
    }
    for p in pairs:
        own = sb.get(f"param/{p.b.name}")
        if p.b.name in weights_b and own is not None and own.shape == weights_b[p.b.name].shape:
            p.own_diff = float(np.abs(weights_b[p.b.name] - own).max(initial=0.0))
    pred_a, loss_a, grads_a = _run(la, fa, feed_a, weights_a)
    pred_b, loss_b, grads_b = _run(lb, fb, feed_b, weights_b, _consts(fa, fb))
    rows = _prediction_rows(pred_a, pred_b, fa, fb)
    rows.append(_row("loss", np.asarray(loss_b), np.asarray(loss_a)))
    # A's run anchored to its source framework: its own float64 replay of the batch
    for key, got in (("output/prediction", pred_a.get("prediction")), ("loss", loss_a)):
        ref = sa.get(f"ref64/{key}")
        if ref is not None and got is not None:
            name = key.split("/")[-1] + f" [A vs {la.framework.get('name', 'source')} float64]"
            rows.append(_row(name, np.asarray(got), np.asarray(ref, np.float64)))
    for p in pairs:
        ga, gb = grads_a.get(p.a.name), grads_b.get(p.b.name)
        if ga is None and gb is None:
            continue
        ga = np.zeros(p.a.raw_shape) if ga is None else ga
        gb = np.zeros(p.b.raw_shape) if gb is None else gb
        back = from_canonical(to_canonical(gb, p.b.steps), p.a.steps)
        rows.append(_row(f"grad {p.a.name}", back, ga))
    return rows


def _prediction_rows(
    pred_a: dict[str, np.ndarray], pred_b: dict[str, np.ndarray], fa: NormalForm, fb: NormalForm
) -> list[Row]:
    rows = []
    for role in sorted(pred_a):
        if not role.startswith("prediction") or role not in pred_b:
            continue
        want, got = pred_a[role], pred_b[role]
        if fa.output is not None and fb.output is not None and got.ndim == len(fb.output.perm):
            want = np.transpose(want, np.argsort(fa.output.perm))
            got = np.transpose(got, np.argsort(fb.output.perm))
        rows.append(_row(role, got, want))
    return rows


def _row(name: str, got: np.ndarray, want: np.ndarray) -> Row:
    if got.shape != want.shape:
        return Row(name, math.inf, float(np.abs(want).max(initial=0.0)), False)
    err = float(np.abs(got - want).max(initial=0.0)) if got.size else 0.0
    scale = max(float(np.abs(want).max(initial=0.0)), float(np.abs(got).max(initial=0.0)))
    ok = bool(np.isfinite(err)) and err <= RTOL * max(scale, np.finfo(np.float64).tiny)
    return Row(name, err, scale, ok)


# -- rendering ------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if v is None:
        return "none"
    return str(v)


def _verdict(c: Comparison) -> str:
    if c.difference is not None:
        return "structures differ"
    return "parity ok" if c.parity else "parity FAILED"


def _lines(c: Comparison, md: bool) -> list[str]:
    code = (lambda s: f"`{s}`") if md else (lambda s: s)
    out = [
        f"A: {code(c.a_name)} ({c.a_about})",
        f"B: {code(c.b_name)} ({c.b_about})",
    ]
    if c.difference is not None:
        out.append(c.difference.line())
        return out
    out.append(f"structure: {c.ops} ops agree; {len(c.pairs)} parameters matched")
    return out


def _text(c: Comparison) -> str:
    lines = [f"tracelog compare: {_verdict(c)}"] + _lines(c, False)
    if c.pairs:
        lines.append("parameters (A's mapped onto B's):")
        for p in c.pairs:
            how = " (--mapping)" if p.by == "mapping" else ""
            if p.own_diff is not None:
                how += "; B's own: " + ("equal" if p.own_diff == 0 else f"{p.own_diff:.3g} off")
            lines.append(
                f"  {p.a.name} {_fmt(list(p.a.raw_shape))} -> {p.b.name} "
                f"{_fmt(list(p.b.raw_shape))}: {p.op} {p.a.role}{how}"
            )
    if c.rows:
        lines.append(
            f"parity in float64 on A's batch (each log's JAX program; within {RTOL:g} x "
            "each output's largest magnitude):"
        )
        w = max(len(r.output) for r in c.rows)
        lines.append(f"  {'output'.ljust(w)}  {'max abs err':>11}  {'scale':>11}  ok")
        for r in c.rows:
            lines.append(
                f"  {r.output.ljust(w)}  {r.max_abs:11.3g}  {r.scale:11.3g}  "
                f"{'yes' if r.ok else 'NO'}"
            )
    return "\n".join(lines)


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("`", "'")


def _markdown(c: Comparison) -> str:
    lines = [f"### tracelog compare: {_verdict(c)}", ""]
    lines += [f"- {_md(x)}" for x in _lines(c, False)]
    if c.pairs:
        lines += ["", "| A parameter | B parameter | op | role | by |", "|---|---|---|---|---|"]
        for p in c.pairs:
            lines.append(
                f"| `{_md(p.a.name)}` {_fmt(list(p.a.raw_shape))} | `{_md(p.b.name)}` "
                f"{_fmt(list(p.b.raw_shape))} | {p.op} | {_md(p.a.role)} | {p.by} |"
            )
    if c.rows:
        lines += [
            "",
            f"Parity in float64 on A's batch, within {RTOL:g} x each output's largest magnitude:",
            "",
            "| output | max abs err | scale | ok |",
            "|---|---:|---:|---|",
        ]
        for r in c.rows:
            lines.append(
                f"| {_md(r.output)} | {r.max_abs:.3g} | {r.scale:.3g} | "
                f"{'yes' if r.ok else '**no**'} |"
            )
    return "\n".join(lines)


def dumps(c: Comparison, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(c.to_json(), indent=1)
    if fmt == "markdown":
        return _markdown(c)
    return _text(c)


def read_mapping(path: str | os.PathLike[str]) -> dict[str, str]:
    """A --mapping file: a JSON object {A parameter: B parameter}."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise LogError(f"cannot read --mapping {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise LogError(f"--mapping {path} is not JSON: {e}") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise LogError(f"--mapping {path}: want a JSON object of parameter names to names")
    return data


class _CallableModule(types.ModuleType):
    """``tracelog.compare(a, b)`` is the public API and ``tracelog.compare``
    this module (as with ``tracelog.diff``): the module itself is the callable."""

    def __call__(
        self,
        a: TraceLog | str | os.PathLike[str],
        b: TraceLog | str | os.PathLike[str],
        *,
        mapping: dict[str, str] | None = None,
    ) -> Comparison:
        return compare(a, b, mapping=mapping)


sys.modules[__name__].__class__ = _CallableModule
