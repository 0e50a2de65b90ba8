"""The one op table every program target shares, and the spelling tables
each target fills.

For each IR op, the shared table (``OPS``) holds what is the same in every
target: which attributes matter, their ONNX defaults, their checks, and the
forms of the op no target writes yet. It turns a node into *fields*: Python
values whose ``str()`` is safe code (ints, finite floats through ``literal``,
lists of ints, printed names). A target then supplies only its *spelling*
of the op: a template over those fields (``"torch.relu({0})"``, inputs by
position, fields by name), or, where a template cannot say it, a function of
the RuleCtx. An op a target cannot write is listed with ``not_yet`` on its
spelling table, with the reason, and ``tracelog emit`` reports it (exit 2).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracelog.emit.common import literal
from tracelog.errors import LogError
from tracelog.ir import DTYPES as IR_DTYPES
from tracelog.ir import Graph, Node, TensorType
from tracelog.ops import schema_for
from tracelog.registry import Table

# the dtype names a program may spell as framework attributes (tf.float32, ...)
DTYPES = IR_DTYPES


@dataclass
class RuleCtx:
    """What a rule sees: the node, printed names of its inputs, constant
    values where an input is a constant, and the fields the shared table
    bound for the node."""

    graph: Graph
    node: Node
    names: dict[str, str]
    constants: dict[str, np.ndarray]
    outs: list[str] = field(default_factory=list)
    mask_key: str = ""  # Dropout: the key of its mask in the rng dict ("mask.<k>")
    mask_expr: str = ""  # or an expression giving it (a module kind's function: from mask_base)
    f: dict[str, Any] = field(default_factory=dict)  # fields, set by the shared table
    takes: frozenset[str] = frozenset()  # a module kind's function: the values it takes

    def i(self, k: int) -> str:
        name = self.node.inputs[k] if k < len(self.node.inputs) else ""
        return self.names[name] if name else "None"

    def has(self, k: int) -> bool:
        return k < len(self.node.inputs) and bool(self.node.inputs[k])

    def const(self, k: int) -> np.ndarray | None:
        if not self.has(k):
            return None
        v = self.graph.values[self.node.inputs[k]]
        if v.kind != "const":
            return None
        from tracelog.emit.onnx import const_array

        return const_array(v, self.constants)

    def ints(self, k: int) -> list[int] | None:
        c = self.const(k)
        return None if c is None else [int(x) for x in np.asarray(c).reshape(-1)]

    def in_type(self, k: int) -> TensorType:
        return self.graph.values[self.node.inputs[k]].type

    def out_type(self, k: int = 0) -> TensorType:
        return self.graph.values[self.node.outputs[k]].type

    def rank(self, k: int = 0) -> int:
        return len(self.in_type(k).shape)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.node.attrs.get(key, default)

    def inputs(self) -> list[str]:
        return [self.i(k) for k in range(len(self.node.inputs))]

    def gets_gradient(self, k: int) -> bool:
        """Whether input k is a float value the program's gradients pass
        through: computed from a trainable parameter, or from a loss graph's
        inputs (the predictions), or taken by a module kind's function (a
        later call may pass it an activation), not through StopGradient."""
        if not self.has(k):
            return False
        name = self.node.inputs[k]
        return self.graph.values[name].type.dtype in FLOAT_DTYPES and (
            name in self.takes or name in differentiable(self.graph)
        )


FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
_DIFFERENTIABLE: dict[int, tuple[Graph, frozenset[str]]] = {}


def differentiable(graph: Graph) -> frozenset[str]:
    """The float values of `graph` a gradient of the loss reaches: those
    computed from a trainable parameter (or, in a loss graph, from an input),
    not through StopGradient. One pass per graph, kept for the emission's
    later nodes (keyed by the graph object, held so its id stays its own)."""
    kept = _DIFFERENTIABLE.get(id(graph))
    if kept is not None and kept[0] is graph:
        return kept[1]
    found = {
        v.name
        for v in graph.values.values()
        if v.type.dtype in FLOAT_DTYPES
        and ((v.kind == "param" and v.trainable) or (v.kind == "input" and graph.kind == "loss"))
    }
    for node in graph.nodes:
        if node.qualified_op != "tracelog.StopGradient" and any(i in found for i in node.inputs):
            found.update(
                o for o in node.outputs if o and graph.values[o].type.dtype in FLOAT_DTYPES
            )
    if len(_DIFFERENTIABLE) > 64:  # one emission's graphs; older ones are done with
        _DIFFERENTIABLE.clear()
    _DIFFERENTIABLE[id(graph)] = (graph, frozenset(found))
    return _DIFFERENTIABLE[id(graph)][1]


Binder = Callable[[RuleCtx], dict[str, Any]]


@dataclass(frozen=True)
class Each:
    """A template applied once per element of a list field, each time to the
    expression so far ({0}) and the element ({it}): torch's x.unsqueeze(a)
    per axis, or one torch.prod per reduced dim."""

    field: str
    template: str


Spelling = str | Each | Callable[[RuleCtx], str | list[str]]


@dataclass(frozen=True)
class OpRule:
    """The shared part of an op: its fields, and how a template applies. A
    "fold" op (variadic Max, Min) applies its two-operand template pairwise."""

    bind: Binder
    fold: bool = False
    variant: Callable[[RuleCtx], str] | None = None  # a spelling key suffix ("Div/int")


class OpTable(Table[OpRule]):
    def op(self, *keys: str, fold: bool = False, variant: Any = None) -> Callable[[Binder], Binder]:
        def deco(fn: Binder) -> Binder:
            for key in keys:
                self.add(key, OpRule(fn, fold, variant))
            return fn

        return deco

    def rule(self, key: str) -> OpRule:
        return self.get(key) or _SCHEMA_RULE


class Spellings(Table[Spelling]):
    """One target's spelling of each op: IR op (or "op/variant") -> template
    or function. `base` entries are inherited; the target's own replace them."""

    def __init__(self, name: str, base: dict[str, Spelling] | None = None) -> None:
        super().__init__(name)
        self._rules.update(base or {})
        self._inherited = set(base or {})

    def add(self, key: str, fn: Spelling) -> None:
        if key in self._inherited:
            self._inherited.discard(key)
            del self._rules[key]
        super().add(key, fn)

    def spell(self, entries: dict[str, Spelling]) -> None:
        for key, spelling in entries.items():
            self.add(key, spelling)


def _no_fields(c: RuleCtx) -> dict[str, Any]:
    return {}


def _schema_fields(c: RuleCtx) -> dict[str, Any]:
    schema = schema_for(c.node.domain, c.node.op)
    return {k: literal(type(d)(c.attr(k, d))) for k, d in schema.defaults}


_SCHEMA_RULE = OpRule(_schema_fields)


def write(spellings: Spellings, c: RuleCtx) -> str | list[str]:
    """The target's code for the node: bind its fields, pick the spelling,
    apply it. NotImplementedError names a form no target writes yet."""
    key = c.node.qualified_op
    rule = OPS.rule(key)
    try:
        c.f = rule.bind(c)
    except (TypeError, ValueError) as e:  # attributes of the wrong kind: a log edited by hand
        where = c.node.module or "<root>"
        raise LogError(f"{key} at {where!r} has malformed attributes ({e})") from None
    variant = rule.variant(c) if rule.variant is not None else ""
    if variant and f"{key}/{variant}" in spellings:  # a form the target spells apart
        key = f"{key}/{variant}"
    elif variant and spellings.reason(f"{key}/{variant}"):  # a form it cannot write yet
        raise NotImplementedError(f"{key} ({variant}): {spellings.reason(f'{key}/{variant}')}")
    spelling = spellings[key]
    if callable(spelling):
        return spelling(c)
    if isinstance(spelling, Each):
        expr = c.i(0)
        for it in c.f[spelling.field]:
            expr = spelling.template.format(expr, it=it, **c.f)
        return expr
    if rule.fold:
        expr = c.i(0)
        for k in range(1, len(c.node.inputs)):
            expr = spelling.format(expr, c.i(k), **c.f)
        return expr
    return spelling.format(*c.inputs(), **c.f)


# Spellings every Python target shares (operators on tensors); targets inherit them.
PYTHON_BASE: dict[str, Spelling] = {
    "Add": "{0} + {1}",
    "Sub": "{0} - {1}",
    "Mul": "{0} * {1}",
    "Div": "{0} / {1}",
}

OPS = OpTable("ops")

# -- element-wise ---------------------------------------------------------------------
# Ops not in this table get their schema's numeric attributes with ONNX's
# defaults as fields (LeakyRelu's {alpha}), and their inputs by position.


def _integer_out(c: RuleCtx) -> str:
    return "int" if c.out_type().dtype.startswith(("int", "uint")) else ""


# ONNX integer Div truncates toward zero; each target spells "Div/int" with its truncation.
OPS.add("Div", OpRule(_no_fields, variant=_integer_out))
OPS.add("Max", OpRule(_no_fields, fold=True))
OPS.add("Min", OpRule(_no_fields, fold=True))


@OPS.op("Clip")
def _clip(c: RuleCtx) -> dict[str, Any]:
    # min and max are optional inputs (clamp(min=0) has no max): None where absent
    return {"lo": _scalar_bound(c, 1), "hi": _scalar_bound(c, 2)}


def _scalar_bound(c: RuleCtx, k: int) -> str:
    """A bound that is a finite one-value constant of x's dtype (float32 or
    float64) as a number literal, which torch.clamp and jnp.clip take in x's
    dtype as they take the constant (ReLU6's ``clamp(x, 0.0, 6.0)`` in one
    line, not three); any other bound by its name."""
    value = c.const(k)
    dtype = c.in_type(0).dtype
    if (
        value is not None
        and np.size(value) == 1
        and dtype in ("float32", "float64")
        and c.in_type(k).dtype == dtype
        and c.out_type().shape == c.in_type(0).shape  # the bound broadcasts nothing
        and np.isfinite(value).all()
    ):
        return literal(float(np.asarray(value).reshape(-1)[0]))
    return c.i(k)


@OPS.op("Gelu")
def _gelu(c: RuleCtx) -> dict[str, Any]:
    tanh = c.attr("approximate", "none") == "tanh"
    return {"approximate": literal("tanh" if tanh else "none"), "tanh": literal(tanh)}


@OPS.op("Cast")
def _cast(c: RuleCtx) -> dict[str, Any]:
    return {"to": dtype_name(str(c.attr("to")))}


@OPS.op("Softmax", "LogSoftmax")
def _axis(c: RuleCtx) -> dict[str, Any]:
    return {"axis": int(c.attr("axis", -1))}


@OPS.op("Einsum")
def _einsum(c: RuleCtx) -> dict[str, Any]:
    eq = str(c.attr("equation"))
    # only einsum's own characters pass into generated code
    if not re.fullmatch(r"[A-Za-z,. ]*(->[A-Za-z. ]*)?", eq):
        raise NotImplementedError(f"einsum equation {eq!r}")
    return {"equation": literal(eq.replace(" ", "")), "operands": ", ".join(c.inputs())}


@OPS.op("Gemm")
def _gemm(c: RuleCtx) -> dict[str, Any]:
    return {
        "alpha": float(c.attr("alpha", 1.0)),
        "beta": float(c.attr("beta", 1.0)),
        "transA": bool(c.attr("transA", 0)),
        "transB": bool(c.attr("transB", 0)),
    }


def scaled_gemm(
    c: RuleCtx, product: str, add: Callable[[RuleCtx, str, int, str], str] | None = None
) -> str:
    """alpha * product + beta * C, with the factors that are 1 left out; `add`
    writes the sum (of the expression, input C's index and its term) where a
    target adds a bias its own way."""
    expr = product if c.f["alpha"] == 1.0 else f"{literal(c.f['alpha'])} * {product}"
    if c.has(2):
        bias = c.i(2) if c.f["beta"] == 1.0 else f"{literal(c.f['beta'])} * {c.i(2)}"
        expr = add(c, expr, 2, bias) if add is not None else f"{expr} + {bias}"
    return expr


# -- convolution and pooling --------------------------------------------------------------
@OPS.op("Conv")
def _conv(c: RuleCtx) -> dict[str, Any]:
    n, a = c.rank() - 2, c.node
    return {
        "pads": a.ints_attr("pads", [0] * 2 * n),
        "strides": a.ints_attr("strides", [1] * n),
        "dilations": a.ints_attr("dilations", [1] * n),
        "group": a.int_attr("group", 1),
        "channels_last": bool(a.int_attr("channels_last", 0)),
    }


@OPS.op("MaxPool", "AveragePool")
def _pool(c: RuleCtx) -> dict[str, Any]:
    a = c.node
    k = a.ints_attr("kernel_shape")
    return {
        "kernel": k,
        "strides": a.ints_attr("strides", [1] * len(k)),
        "pads": a.ints_attr("pads", [0] * 2 * len(k)),
        "dilations": a.ints_attr("dilations", [1] * len(k)),
        "ceil": bool(a.int_attr("ceil_mode", 0)),
        "include_pad": bool(a.int_attr("count_include_pad", 0)),
        "channels_last": bool(a.int_attr("channels_last", 0)),
    }


@OPS.op("GlobalAveragePool")
def _global_pool(c: RuleCtx) -> dict[str, Any]:
    rank = c.rank()
    last = bool(int(c.attr("channels_last", 0)))
    axes = list(range(1, rank - 1)) if last else list(range(2, rank))
    return {"axes": axes, "axes_t": tuple(axes)}


# -- normalisation ----------------------------------------------------------------------------
def _channel_axis(c: RuleCtx) -> int:
    return c.rank() - 1 if int(c.attr("channels_last", 0)) else 1


@OPS.op("BatchNormalization")
def _batch_norm(c: RuleCtx) -> dict[str, Any]:
    return {"eps": literal(float(c.attr("epsilon", 1e-5))), "channel_axis": _channel_axis(c)}


def _batch_norm_training(c: RuleCtx) -> dict[str, Any]:
    momentum = float(c.attr("momentum"))
    return {
        "eps": literal(float(c.attr("epsilon"))),
        "momentum": literal(momentum),
        "axes": [int(a) for a in c.attr("axes")],
        "channel_axis": _channel_axis(c),
        "decay": literal(float(c.attr("decay", 1.0 - momentum))),
        "unbiased": bool(int(c.attr("unbiased", 1))),
    }


def _weighted_update(c: RuleCtx) -> str:
    """Keras' running-statistics update (decay given, or the biased variance):
    "weighted", which every target writes with its own helper."""
    return "weighted" if "decay" in c.node.attrs or not c.f["unbiased"] else ""


OPS.add("tracelog.BatchNormTraining", OpRule(_batch_norm_training, variant=_weighted_update))


@OPS.op("LayerNormalization")
def _layer_norm(c: RuleCtx) -> dict[str, Any]:
    rank = c.rank()
    axis = int(c.attr("axis", -1)) % rank
    return {
        "axis": axis,
        "axes": list(range(axis, rank)),
        "axes_t": tuple(range(axis, rank)),
        "eps": literal(float(c.attr("epsilon", 1e-5))),
        "bias": c.i(2) if c.has(2) else "None",
    }


@OPS.op("Dropout")
def _dropout(c: RuleCtx) -> dict[str, Any]:
    return {"key": c.mask_expr or literal(c.mask_key)}


# a random draw's two parameters and their defaults, by op
_DRAW_ATTRS: dict[str, tuple[tuple[str, float], ...]] = {
    "RandomUniformLike": (("low", 0.0), ("high", 1.0)),
    "RandomNormalLike": (("mean", 0.0), ("scale", 1.0)),
}


@OPS.op("tracelog.RandomExponentialLike")  # rate 1: no parameter
def _random_exponential(c: RuleCtx) -> dict[str, Any]:
    return {"key": c.mask_expr or literal(c.mask_key)}


@OPS.op(*_DRAW_ATTRS)
def _random_draw(c: RuleCtx) -> dict[str, Any]:
    fields = {k: literal(float(c.attr(k, default))) for k, default in _DRAW_ATTRS[c.node.op]}
    return {"key": c.mask_expr or literal(c.mask_key), **fields}


# -- reductions ---------------------------------------------------------------------------------
def _reduce(c: RuleCtx) -> dict[str, Any]:
    axes = c.ints(1) if c.has(1) else None
    if c.has(1) and axes is None:
        raise NotImplementedError("reduction over computed axes")
    return {
        "axes": axes,  # None: every axis
        "axes_t": "None" if axes is None else tuple(axes),
        "dims": tuple(range(c.rank()) if axes is None else axes),
        # one dim at a time, last first, so the dims still to reduce keep their index
        "dims_desc": sorted((a % c.rank() for a in (axes or range(c.rank()))), reverse=True),
        "keep": bool(int(c.attr("keepdims", 1))),
    }


def _all_axes(c: RuleCtx) -> str:
    return "all" if c.f["axes"] is None else ""


for _op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
    OPS.add(_op, OpRule(_reduce, variant=_all_axes))


def _argmax(c: RuleCtx) -> dict[str, Any]:
    return {"axis": int(c.attr("axis", 0)), "keep": bool(int(c.attr("keepdims", 1)))}


OPS.add("ArgMax", OpRule(_argmax, variant=lambda c: "" if c.f["keep"] else "drop"))


def _operand(c: RuleCtx) -> str:
    """The variant of a shape-taking op whose shape is computed at run time."""
    return "operand" if c.f["ints"] is None else ""


# -- shapes ----------------------------------------------------------------------------------------
def _ints_operand(c: RuleCtx) -> dict[str, Any]:
    """A shape-like operand 1 (Reshape's shape, Expand's shape, Tile's
    repeats): as a list and a tuple when constant."""
    ints = c.ints(1)
    return {"ints": ints, "ints_t": None if ints is None else tuple(ints)}


def _reshape(c: RuleCtx) -> dict[str, Any]:
    fields = _ints_operand(c)
    ints = fields["ints"]
    if ints is not None and 0 in ints:
        raise NotImplementedError("Reshape with 0 (copy) dims")
    if ints is not None and -1 not in ints and _reads_weight(c) and max(ints, default=1) > 1:
        # a weight's reshape (a depthwise kernel's [3, 3, 1, C]) with its
        # largest dim as -1: the same number for this weight, and the same
        # text for every width, so that layers of other widths share a kind's
        # function (a weight is never empty, which -1 could not size)
        k = len(ints) - 1 - ints[::-1].index(max(ints))
        ints = [*ints[:k], -1, *ints[k + 1 :]]
        fields = {"ints": ints, "ints_t": tuple(ints)}
    return fields


def _reads_weight(c: RuleCtx) -> bool:
    return c.has(0) and c.graph.values[c.node.inputs[0]].kind in ("param", "buffer")


def unit_dims_index(before: tuple[Any, ...], after: tuple[Any, ...]) -> str | None:
    """Where a reshape only inserts dims of size 1 (Keras' squeeze-excite
    [batch, C] -> [batch, 1, 1, C]), its index: ":" for each dim kept,
    "None" for each inserted ("x[:, None, None, :]", the same in every
    target and at every width); None where it does anything else."""
    index, i = [], 0
    for dim in after:
        if i < len(before) and dim == before[i]:
            index.append(":")
            i += 1
        elif dim == 1:
            index.append("None")
        else:
            return None
    if i != len(before) or len(after) == len(before):
        return None
    return ", ".join(index)


def _reshape_fields(c: RuleCtx) -> dict[str, Any]:
    fields = _reshape(c)
    if fields["ints"] is not None:
        fields["index"] = unit_dims_index(c.in_type(0).shape, c.out_type(0).shape)
    return fields


def _reshape_variant(c: RuleCtx) -> str:
    if c.f["ints"] is None:
        return "operand"
    return "unit_dims" if c.f.get("index") else ""


OPS.add("Reshape", OpRule(_reshape_fields, variant=_reshape_variant))
for _op, _bind in (("Expand", _ints_operand), ("Tile", _ints_operand)):
    OPS.add(_op, OpRule(_bind, variant=_operand))


@OPS.op("Transpose")
def _transpose(c: RuleCtx) -> dict[str, Any]:
    perm = [int(p) for p in c.attr("perm")]
    return {"perm": perm, "perm_t": tuple(perm)}


def _concat(c: RuleCtx) -> dict[str, Any]:
    return {"axis": int(c.attr("axis")), "parts": ", ".join(c.inputs())}


def _assembles_shape(c: RuleCtx) -> str:
    """A Concat of int64 vectors none of whose parts reads a traced value (a data
    input, a parameter, a constant read from the weights) other than through
    Shape: a shape being assembled, which JAX keeps static. An int64 vector
    computed from the weights (a row of an index table the forward builds, as
    BEiT's) is not."""
    out = c.out_type()
    if out.dtype != "int64" or len(out.shape) != 1:
        return ""
    return "" if any(_traced(c.graph, name) for name in c.node.inputs if name) else "shape"


# the last graph asked about, its node count, its producers and what is known of
# its values (one pass a graph: the question is asked per Concat)
_traced_in: list[Any] = [None, -1, {}, {}]


def _traced(graph: Graph, name: str) -> bool:
    """Whether a value depends on a data input, a parameter, a buffer or a
    constant stored with the weights, other than through a Shape (which reads
    only the static shape)."""
    if _traced_in[0] is not graph or _traced_in[1] != len(graph.nodes):
        _traced_in[:] = [graph, len(graph.nodes), graph.producers(), {}]
    producers, known = _traced_in[2], _traced_in[3]
    todo = [name]
    while todo:
        top = todo[-1]
        if top in known:
            todo.pop()
            continue
        v = graph.values[top]
        node = producers.get(top)
        if v.kind == "const":
            known[top] = v.const is not None and v.const.digest is not None
        elif v.kind != "node" or node is None:
            known[top] = True  # a data input, a parameter or a buffer
        elif node.op == "Shape":
            known[top] = False
        else:
            waiting = [i for i in node.inputs if i and i not in known]
            if waiting:
                todo.extend(waiting)
                continue
            known[top] = any(known[i] for i in node.inputs if i)
        todo.pop()
    return bool(known[name])


OPS.add("Concat", OpRule(_concat, variant=_assembles_shape))


def _split(c: RuleCtx) -> dict[str, Any]:
    sizes = c.ints(1)
    return {
        "axis": int(c.attr("axis", 0)),
        "sizes": sizes,  # None: num_outputs parts, as even as they come
        "cuts": None if sizes is None else [sum(sizes[: k + 1]) for k in range(len(sizes) - 1)],
        "n": int(c.attr("num_outputs", len(c.node.outputs))),
    }


OPS.add("Split", OpRule(_split, variant=lambda c: "even" if c.f["sizes"] is None else ""))


def _slice(c: RuleCtx) -> dict[str, Any]:
    const_starts, const_ends = c.ints(1), c.ints(2)
    axes = c.ints(3) if c.has(3) else None
    steps = c.ints(4) if c.has(4) else None
    if (c.has(3) and axes is None) or (c.has(4) and steps is None):
        raise NotImplementedError("Slice with computed axes or steps")
    known = const_starts if const_starts is not None else const_ends
    n = len(known) if known is not None else c.in_type(1).shape[0]
    if not isinstance(n, int) or (const_starts is None and min(steps or [1]) < 0):
        raise NotImplementedError("Slice with computed starts and a negative step")
    # starts or ends computed at run time (a slice as long as a sequence, the last
    # T of a table): element k of the vector, which every Python target's
    # subscripts accept
    starts: list[int | str] = (
        list(const_starts) if const_starts is not None else [f"{c.i(1)}[{k}]" for k in range(n)]
    )
    ends: list[int | str] = (
        list(const_ends) if const_ends is not None else [f"{c.i(2)}[{k}]" for k in range(n)]
    )
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    rank = c.rank()
    index = [":"] * rank
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        end = "" if isinstance(e, int) and e >= 2**62 else str(e)
        step = "" if st == 1 else f":{st}"
        index[a % rank] = f"{s if s else ''}:{end}{step}"
    while index and index[-1] == ":":
        index.pop()
    # whole axes reversed (x[::-1]): a form targets without negative steps spell as a flip
    whole = all(
        s == -1 and isinstance(e, int) and e <= -(2**62) and st == -1
        for s, e, st in zip(starts, ends, steps, strict=True)
    )
    # x[a:b:s]: subscript syntax every Python target's tensors accept
    return {
        "index": ", ".join(index),
        "steps": steps,
        "flip": [a % rank for a in axes] if whole else None,
    }


def _slice_variant(c: RuleCtx) -> str:
    if min(c.f["steps"]) >= 0:
        return ""
    return "flip" if c.f["flip"] is not None else "reversed"


OPS.add("Slice", OpRule(_slice, variant=_slice_variant))


@OPS.op("Gather")
def _gather(c: RuleCtx) -> dict[str, Any]:
    idx = c.const(1)
    axis = int(c.attr("axis", 0))
    index = c.i(1)
    if idx is not None and idx.ndim == 0:
        # ONNX counts a negative index from the end; tf.gather refuses one (x[:, -1])
        size = c.in_type(0).shape[axis]
        k = int(idx)
        if k < 0 and isinstance(size, int):
            k += size
        # a symbolic size: the index counted from the run-time size (every target's
        # tensors know their shape when the op runs)
        index = literal(k) if k >= 0 else f"({c.i(0)}.shape[{axis}] - {-k})"
    # lead: the full slices before the gathered axis, for targets that index (x[:, :, idx])
    return {"axis": axis, "index": index, "lead": ":, " * (axis % c.rank())}


@OPS.op("Unsqueeze")
def _unsqueeze(c: RuleCtx) -> dict[str, Any]:
    axes = c.ints(1)
    if axes is None:
        raise NotImplementedError("Unsqueeze with computed axes")
    rank = len(c.out_type().shape)
    return {"axes": sorted(a % rank for a in axes), "axes_t": tuple(sorted(a % rank for a in axes))}


def _squeeze(c: RuleCtx) -> dict[str, Any]:
    axes = c.ints(1) if c.has(1) else None
    return {"axes": axes, "axes_t": tuple(axes or ())}


OPS.add("Squeeze", OpRule(_squeeze, variant=lambda c: "" if c.f["axes"] else "all"))


def last_dim_first(pads: list[int]) -> list[int]:
    """ONNX pads [b1, b2, e1, e2] -> [b2, e2, b1, e1], the last dim first (F.pad)."""
    half = len(pads) // 2
    out: list[int] = []
    for k in reversed(range(half)):
        out += [pads[k], pads[k + half]]
    return out


def _pad(c: RuleCtx) -> dict[str, Any]:
    pads = c.ints(1)
    if pads is None or c.has(3) or c.attr("mode", "constant") != "constant":
        raise NotImplementedError("Pad other than constant with constant pads")
    half = len(pads) // 2
    pairs = [[pads[k], pads[k + half]] for k in range(half)]
    return {
        "pairs": pairs,
        "pairs_t": [tuple(p) for p in pairs],
        "last_first": last_dim_first(pads),
    }


OPS.add("Pad", OpRule(_pad, variant=lambda c: "valued" if c.has(2) else ""))


def _shape(c: RuleCtx) -> dict[str, Any]:
    start = "" if c.attr("start") is None else c.node.int_attr("start")
    end = "" if c.attr("end") is None else c.node.int_attr("end")
    return {"range": f"[{start}:{end}]"}


def _whole(c: RuleCtx) -> str:
    return "whole" if c.attr("start") is None and c.attr("end") is None else ""


OPS.add("Shape", OpRule(_shape, variant=_whole))


@OPS.op("ConstantOfShape")
def _constant_of_shape(c: RuleCtx) -> dict[str, Any]:
    dtype = dtype_name(c.out_type().dtype)
    value = c.attr("value", 0.0)
    # the value in the output's type: a bool or int fill is not a float literal
    if dtype == "bool":
        value = bool(value)
    elif dtype.startswith(("int", "uint")):
        value = int(value)
    return {"value": literal(value), "dtype": dtype}


# -- losses ------------------------------------------------------------------------------------------
def _nll(c: RuleCtx) -> dict[str, Any]:
    ignore = c.attr("ignore_index")
    return {
        "weight": c.i(2) if c.has(2) else "None",
        "reduction": literal(str(c.attr("reduction", "mean"))),
        "ignore": literal(int(ignore)) if ignore is not None else "None",
    }


OPS.add(
    "NegativeLogLikelihoodLoss",
    OpRule(_nll, variant=lambda c: "ignore" if c.f["ignore"] != "None" else ""),
)


# -- vision: group norm, transposed convolution, resize (issue 12) --
@OPS.op("GroupNormalization")
def _group_norm(c: RuleCtx) -> dict[str, Any]:
    return {
        "groups": c.node.int_attr("num_groups"),
        "eps": literal(float(c.attr("epsilon", 1e-5))),
        "channel_axis": _channel_axis(c),
        "channels_last": bool(c.node.int_attr("channels_last", 0)),
    }


@OPS.op("ConvTranspose")
def _conv_transpose(c: RuleCtx) -> dict[str, Any]:
    a = c.node
    if a.attrs.get("output_shape") is not None or a.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        raise NotImplementedError("ConvTranspose with output_shape or auto_pad")
    n = c.rank() - 2
    kernel = c.in_type(1).shape[2:]
    if not all(isinstance(k, int) for k in kernel):
        raise NotImplementedError("ConvTranspose with a symbolic kernel size")
    return {
        "kernel": [int(k) for k in kernel],
        "pads": a.ints_attr("pads", [0] * 2 * n),
        "strides": a.ints_attr("strides", [1] * n),
        "dilations": a.ints_attr("dilations", [1] * n),
        "output_padding": a.ints_attr("output_padding", [0] * n),
        "group": a.int_attr("group", 1),
        "channels_last": bool(a.int_attr("channels_last", 0)),
        "bias": c.i(2) if c.has(2) else "None",
    }


RESIZE_MODES = ("nearest", "linear", "cubic")
RESIZE_COORDINATES = ("half_pixel", "asymmetric", "align_corners")
RESIZE_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@OPS.op("Resize")
def _resize(c: RuleCtx) -> dict[str, Any]:
    """ONNX Resize, the forms the targets write: the resized axes with their
    scales (a constant) or sizes (a constant); no roi, antialias or aspect
    policy. scales is None where sizes are given, and the reverse."""
    a, rank = c.node, c.rank()
    mode = str(c.attr("mode", "nearest"))
    coord = str(c.attr("coordinate_transformation_mode", "half_pixel"))
    nearest = str(c.attr("nearest_mode", "round_prefer_floor"))
    if mode not in RESIZE_MODES or coord not in RESIZE_COORDINATES or nearest not in RESIZE_NEAREST:
        raise NotImplementedError(f"Resize mode {mode!r} with coordinates {coord!r}")
    if a.int_attr("antialias", 0) or a.int_attr("exclude_outside", 0):
        raise NotImplementedError("Resize with antialias or exclude_outside")
    if str(c.attr("keep_aspect_ratio_policy", "stretch")) != "stretch":
        raise NotImplementedError("Resize with a keep_aspect_ratio_policy")
    axes = [x % rank for x in a.ints_attr("axes", list(range(rank)))]
    scales = c.const(2)
    if scales is not None and scales.size == 0:  # an empty scales input: sizes say it
        scales = None
    sizes = c.ints(3) if c.has(3) else None
    if (c.has(2) and scales is None and not c.has(3)) or (c.has(3) and sizes is None):
        raise NotImplementedError("Resize with computed scales or sizes")
    given = sizes if scales is None else list(scales.reshape(-1))
    if given is None or (scales is not None and sizes is not None) or len(given) != len(axes):
        raise ValueError("Resize takes one of scales and sizes, one per axis")
    return {
        "axes": axes,
        "scales": None if scales is None else literal([float(s) for s in scales.reshape(-1)]),
        "sizes": sizes,
        "mode": literal(mode),
        "coord": literal(coord),
        "nearest": literal(nearest),
        "cubic_a": literal(float(c.attr("cubic_coeff_a", -0.75))),
    }


def pool_ceil_extra(c: RuleCtx) -> list[int]:
    """MaxPool / AveragePool: per spatial axis, the positions past the end
    padding that ceil_mode's last window covers (zeros without ceil_mode). As
    in torch, a last window must start inside the input or its begin padding.
    Read off the static input size: floor-mode pooling over that much more
    padding gives ceil_mode's output; AveragePool's divisor leaves it out."""
    k, s, p, d = c.f["kernel"], c.f["strides"], c.f["pads"], c.f["dilations"]
    n = len(k)
    if not c.f["ceil"]:
        return [0] * n
    shape = c.in_type(0).shape
    spatial = shape[1 : 1 + n] if c.f["channels_last"] else shape[2 : 2 + n]
    extra = []
    for i, size in enumerate(spatial):
        if not isinstance(size, int):
            raise NotImplementedError(f"{c.node.op} with ceil_mode over a symbolic size")
        window, span = d[i] * (k[i] - 1) + 1, size + p[i] + p[i + n]
        out = -(-(span - window) // s[i]) + 1
        if (out - 1) * s[i] >= size + p[i]:
            out -= 1
        extra.append(max(0, (out - 1) * s[i] + window - span))
    return extra


# -- attention, masks and indexing (issue 12) -------------------------------------------------
def _mod_form(c: RuleCtx) -> str:
    # fmod=0 is Python's %: the result takes the divisor's sign (wrapping negative indices);
    # fmod=1 is C's fmod, the dividend's sign ("Mod/fmod": torch.fmod, jnp.fmod)
    return "fmod" if int(c.attr("fmod", 0)) else ""


OPS.add("Mod", OpRule(_no_fields, variant=_mod_form))


def _inf_sides(c: RuleCtx) -> str:
    # IsInf of one sign only: "IsInf/pos" (detect_negative=0), "IsInf/neg" (detect_positive=0)
    negative, positive = int(c.attr("detect_negative", 1)), int(c.attr("detect_positive", 1))
    if not (negative or positive):
        raise NotImplementedError("IsInf detecting neither infinity")
    return "" if negative and positive else "pos" if positive else "neg"


OPS.add("IsInf", OpRule(_no_fields, variant=_inf_sides))


@OPS.op("tracelog.CumProd")
def _cumprod(c: RuleCtx) -> dict[str, Any]:
    return {"axis": int(c.attr("axis"))}


@OPS.op("Trilu")
def _trilu(c: RuleCtx) -> dict[str, Any]:
    k = c.ints(1) if c.has(1) else [0]
    if k is None:
        raise NotImplementedError("Trilu with a computed diagonal")
    upper = bool(int(c.attr("upper", 1)))
    # tri: the function numpy, torch and jax.numpy call it
    return {"k": k[0], "upper": upper, "tri": "triu" if upper else "tril"}


def _batch_broadcast(c: RuleCtx) -> str:
    """The variant of Solve and SolveTriangular whose A and B differ in their
    batch dims (a parameter matrix solved against a batch): TensorFlow's
    solve and JAX's triangular_solve take equal ones."""
    return "broadcast" if c.in_type(0).shape[:-2] != c.in_type(1).shape[:-2] else ""


OPS.add("tracelog.Solve", OpRule(_no_fields, variant=_batch_broadcast))


def _solve_triangular(c: RuleCtx) -> dict[str, Any]:
    upper = bool(int(c.attr("upper", 0)))
    return {"upper": upper, "lower": not upper}


OPS.add("tracelog.SolveTriangular", OpRule(_solve_triangular, variant=_batch_broadcast))


@OPS.op("CumSum")
def _cumsum(c: RuleCtx) -> dict[str, Any]:
    axis = c.ints(1)
    if axis is None:
        raise NotImplementedError("CumSum over a computed axis")
    if int(c.attr("exclusive", 0)) or int(c.attr("reverse", 0)):
        raise NotImplementedError("CumSum exclusive or reversed")
    return {"axis": axis[0] % c.rank()}


@OPS.op("TopK")
def _topk(c: RuleCtx) -> dict[str, Any]:
    known = c.ints(1)
    axis = int(c.attr("axis", -1)) % c.rank()
    k: int | None = None  # the whole axis
    if known is not None:
        k = known[0]
    elif c.out_type(0).shape[axis] != c.in_type(0).shape[axis]:
        # a computed K is taken only as the input's own size along the axis (a
        # symbolic dim sorted whole, as the output type says)
        raise NotImplementedError("TopK with a computed k")
    return {"k": k, "axis": axis, "largest": bool(int(c.attr("largest", 1)))}


@OPS.op("Compress")
def _compress(c: RuleCtx) -> dict[str, Any]:
    if c.attr("axis") is None:
        raise NotImplementedError("Compress of the flattened input (no axis)")
    axis = int(c.attr("axis")) % c.rank()
    return {"axis": axis, "lead": ":, " * axis}


@OPS.op("GatherElements")
def _gather_elements(c: RuleCtx) -> dict[str, Any]:
    return {"axis": int(c.attr("axis", 0)) % c.rank()}


def _scatter_elements(c: RuleCtx) -> dict[str, Any]:
    reduction = str(c.attr("reduction", "none"))
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise NotImplementedError(f"ScatterElements with reduction {reduction!r}")
    return {"axis": int(c.attr("axis", 0)) % c.rank(), "reduction": reduction}


# each reduction is a form the targets spell apart ("ScatterElements/add")
OPS.add(
    "ScatterElements",
    OpRule(
        _scatter_elements, variant=lambda c: "" if c.f["reduction"] == "none" else c.f["reduction"]
    ),
)

# -- recurrent layers (issue 12) --
# Every target spells these as its runtime's _lstm, _gru and _rnn, which hold the time loop
# (a program's size does not depend on the sequence length). The fields check the forms
# those helpers compute: ONNX's default activations (RNN: tanh or relu), layout 0, no clip
# or peepholes; sequence_lens and GRU's linear_before_reset either way.
_GATE_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _recurrent_form(c: RuleCtx) -> None:
    """Raise NotImplementedError for a form of LSTM, GRU or RNN no helper computes."""
    op = c.node.op
    if str(c.attr("direction", "forward")) not in ("forward", "reverse", "bidirectional"):
        raise NotImplementedError(f"{op} with direction {c.attr('direction')!r}")
    if int(c.attr("layout", 0)) != 0:
        raise NotImplementedError(f"{op} with layout=1 (batch first)")
    for key in ("clip", "activation_alpha", "activation_beta"):
        if c.attr(key) is not None:
            raise NotImplementedError(f"{op} with {key}")
    if op == "LSTM" and (c.has(7) or int(c.attr("input_forget", 0))):
        raise NotImplementedError("LSTM with peepholes or input_forget")


def _recurrent(c: RuleCtx) -> dict[str, Any]:
    _recurrent_form(c)
    op = c.node.op
    direction = str(c.attr("direction", "forward"))
    dirs = 2 if direction == "bidirectional" else 1
    activations = [str(a) for a in c.attr("activations", [])]
    # RNN: one activation, the same in each direction; LSTM and GRU: ONNX's defaults
    activation = activations[0] if op == "RNN" and activations else "Tanh"
    allowed = [activation] * dirs if op == "RNN" else _GATE_ACTIVATIONS[op] * dirs
    if (activations and activations != allowed) or activation not in ("Tanh", "Relu"):
        raise NotImplementedError(f"{op} with activations {activations}")
    n_out = len(c.node.outputs)
    # forms beyond torch's own layers, as keyword arguments (a program without them reads
    # as before): sequence_lens (Keras masks) and GRU's linear_before_reset=0 (Keras
    # reset_after=False)
    extra = f", lens={c.i(4)}" if c.has(4) else ""
    if op == "GRU" and int(c.attr("linear_before_reset", 0)) != 1:
        extra += ", linear_before_reset=0"
    return {
        "extra": extra,
        "bias": c.i(3) if c.has(3) else "None",
        "h0": c.i(5) if c.has(5) else "None",
        "c0": c.i(6) if c.has(6) else "None",
        "direction": literal(direction),
        "activation": literal(activation.lower()),
        # the helper returns every output; a node may name fewer
        "take": "" if n_out == (3 if op == "LSTM" else 2) else "[0]" if n_out == 1 else "[:2]",
    }


OPS.update_from(["LSTM", "GRU", "RNN"], OpRule(_recurrent))


# -- scaled dot-product attention (issue 15) --
@OPS.op("tracelog.Attention")
def _attention(c: RuleCtx) -> dict[str, Any]:
    scale = float(c.attr("scale"))
    if not np.isfinite(scale):
        raise ValueError(f"scale {scale}")
    return {
        "scale": literal(scale),
        "causal": bool(int(c.attr("is_causal", 0))),
        "mask": c.i(3) if c.has(3) else "None",
    }


# -- CTC loss: every target's runtime writes the alpha recursion (_ctc_loss), but torch's
# own F.ctc_loss
@OPS.op("tracelog.CTCLoss")
def _ctc_loss(c: RuleCtx) -> dict[str, Any]:
    if c.rank(0) != 3 or c.rank(1) not in (1, 2):
        raise NotImplementedError("CTCLoss of unbatched log-probabilities")
    return {
        "blank": int(c.attr("blank", 0)),
        "zero_infinity": bool(int(c.attr("zero_infinity", 0))),
    }


def dtype_name(dtype: str) -> str:
    """A dtype name that may be spelled as an attribute (tf.float32)."""
    if dtype not in DTYPES:
        raise NotImplementedError(f"dtype {dtype!r}")
    return dtype


def not_yet_everywhere(spellings: Spellings) -> None:
    """What no target writes: ops the adapters could not record."""
    spellings.not_yet("tracelog.Unsupported", reason="the source op could not be recorded")
