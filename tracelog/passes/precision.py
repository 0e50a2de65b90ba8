"""A graph in float64: every float32 value, cast and constant widened.

The translation check runs the IR (the ONNX target's graphs) in float64
against the sample's float64 reference, so a difference is the translation's
and never float32 rounding. The half types (autocast's casts to bfloat16, a
float16 model) widen too, as the torch reference replays them in float64;
integers and booleans stay.

ONNX float attributes are float32 by the standard: LeakyRelu's alpha 0.01
reaches a runtime as 0.00999999977648, a layer norm's epsilon 1e-5 as
9.99999974738e-06. The IR holds each such number as the source meant it (torch's
float64 kernels take the Python double; TensorFlow's kernels read their float
attributes as float32, and its rules record that value), so in the widened graph
an op whose float attribute float32 cannot hold is rewritten into standard ops
with the number as a float64 constant (`EXACT`). The normalisations are rewritten
whatever their epsilon: their statistics' precision (`stash_type`) is float32 by
default. tracelog ops need nothing: their float attributes are double tensors in
ONNX (tracelog.emit.onnx).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np

from tracelog.ir import AttrValue, ConstData, Dim, Graph, Node, TensorType, Value, dim_mul

# attributes that name a dtype (Cast's target; the random-like ops' output type)
_DTYPE_ATTRS = {("Cast", "to"), ("RandomUniformLike", "dtype"), ("RandomNormalLike", "dtype")}
_NARROW = ("float32", "bfloat16", "float16")  # the float dtypes the float64 graph widens


def promoted_float64(graph: Graph) -> Graph:
    """A copy of `graph` computing in float64 where it computed in float32,
    every float attribute with the value the IR holds (`EXACT`)."""
    wide = copy.deepcopy(graph)
    for v in wide.values.values():
        if v.type.dtype in _NARROW:
            v.type = TensorType("float64", v.type.shape)
    for node in wide.nodes:
        for key, value in node.attrs.items():
            if (node.op, key) in _DTYPE_ATTRS and value in _NARROW:
                node.attrs[key] = "float64"
    nodes: list[Node] = []
    for node in wide.nodes:
        rewrite = EXACT.get(node.op) if not node.domain else None
        made = rewrite(_Rewriter(wide, node)) if rewrite is not None else None
        nodes.extend([node] if made is None else made)
    wide.nodes = nodes
    return wide


def promoted_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds and constants for a promoted graph: float32 (and half) arrays in float64."""
    return {k: a.astype(np.float64) if a.dtype.name in _NARROW else a for k, a in arrays.items()}


def float32_exact(value: object) -> bool:
    """Whether float32 holds `value` (a float attribute) exactly."""
    if not isinstance(value, float):
        return True
    return bool(np.isnan(value)) or float(np.float32(value)) == value


class _Rewriter:
    """Standard ops that replace one node of a widened graph: new values named
    after the node's first output, the node's module and source on each."""

    def __init__(self, graph: Graph, node: Node) -> None:
        self.graph, self.node = graph, node
        self.made: list[Node] = []
        self._count = 0

    def ty(self, name: str) -> TensorType:
        return self.graph.values[name].type

    def attr(self, key: str, default: float) -> float:
        return float(self.node.attrs.get(key, default))  # type: ignore[arg-type]

    def _name(self) -> str:
        self._count += 1
        name = f"{self.node.outputs[0]}.f64_{self._count}"
        while name in self.graph.values:
            name += "_"
        return name

    def const(self, value: float | list[int], dtype: str = "float64") -> str:
        """A constant: a float64 scalar, or a 1-D int64 list."""
        name = self._name()
        shape: tuple[Dim, ...] = (len(value),) if isinstance(value, list) else ()
        data = list(value) if isinstance(value, list) else [float(value)]
        self.graph.values[name] = Value(
            name, TensorType(dtype, shape), "const", const=ConstData(data)
        )
        return name

    def op(
        self,
        op: str,
        inputs: list[str],
        ty: TensorType,
        out: str | None = None,
        attrs: dict[str, AttrValue] | None = None,
    ) -> str:
        """A node; its output `out` (one of the replaced node's) or a new value."""
        if not out:
            out = self._name()
            self.graph.values[out] = Value(out, ty, "node")
        n = self.node
        self.made.append(
            Node(
                op,
                inputs,
                [out],
                dict(attrs or {}),
                module=n.module,
                module_type=n.module_type,
                source=n.source,
            )
        )
        return out

    def output(self, k: int) -> str | None:
        """The replaced node's k-th output, where it has one."""
        outs = self.node.outputs
        return outs[k] if k < len(outs) and outs[k] else None


Rewrite = Callable[[_Rewriter], list[Node] | None]
EXACT: dict[str, Rewrite] = {}


def _exact(*ops: str) -> Callable[[Rewrite], Rewrite]:
    def register(fn: Rewrite) -> Rewrite:
        for op in ops:
            EXACT[op] = fn
        return fn

    return register


def _bool(ty: TensorType) -> TensorType:
    return TensorType("bool", ty.shape)


@_exact("LeakyRelu")
def _leaky_relu(r: _Rewriter) -> list[Node] | None:
    """x if x > 0 else alpha * x (torch's kernel)."""
    alpha = r.attr("alpha", 0.01)
    if float32_exact(alpha):
        return None
    x, y = r.node.inputs[0], r.node.outputs[0]
    ty = r.ty(y)
    pos = r.op("Greater", [x, r.const(0.0)], _bool(ty))
    neg = r.op("Mul", [x, r.const(alpha)], ty)
    r.op("Where", [pos, x, neg], ty, out=y)
    return r.made


@_exact("Celu")
def _celu(r: _Rewriter) -> list[Node] | None:
    """x if x > 0 else alpha * (exp(x / alpha) - 1)."""
    alpha = r.attr("alpha", 1.0)
    if float32_exact(alpha):
        return None
    x, y = r.node.inputs[0], r.node.outputs[0]
    ty = r.ty(y)
    a = r.const(alpha)
    pos = r.op("Greater", [x, r.const(0.0)], _bool(ty))
    e = r.op("Exp", [r.op("Div", [x, a], ty)], ty)
    neg = r.op("Mul", [r.op("Sub", [e, r.const(1.0)], ty), a], ty)
    r.op("Where", [pos, x, neg], ty, out=y)
    return r.made


@_exact("Gemm")
def _gemm(r: _Rewriter) -> list[Node] | None:
    """alpha * op(A) op(B) + beta * C as Gemm, Mul and Add."""
    alpha, beta = r.attr("alpha", 1.0), r.attr("beta", 1.0)
    if float32_exact(alpha) and float32_exact(beta):
        return None
    a, b, *c = r.node.inputs
    y = r.node.outputs[0]
    ty = r.ty(y)
    trans: dict[str, AttrValue] = {
        k: v for k, v in r.node.attrs.items() if k in ("transA", "transB")
    }
    product = r.op("Gemm", [a, b], ty, attrs=trans)
    scaled = r.op("Mul", [product, r.const(alpha)], ty) if alpha != 1.0 else product
    if not c or not c[0]:
        r.op("Identity", [scaled], ty, out=y)
        return r.made
    bias = r.op("Mul", [c[0], r.const(beta)], r.ty(c[0])) if beta != 1.0 else c[0]
    r.op("Add", [scaled, bias], ty, out=y)
    return r.made


@_exact("BatchNormalization")
def _batch_norm(r: _Rewriter) -> list[Node] | None:
    """Inference batch norm: epsilon added to the variance input, epsilon 0."""
    eps = r.attr("epsilon", 1e-5)
    if float32_exact(eps) or r.node.attrs.get("training_mode"):
        return None
    x, scale, bias, mean, var = r.node.inputs
    var_eps = r.op("Add", [var, r.const(eps)], r.ty(var))
    attrs = {**r.node.attrs, "epsilon": 0.0}
    node = copy.copy(r.node)
    node.inputs, node.attrs = [x, scale, bias, mean, var_eps], attrs
    return [*r.made, node]


def _normalised(r: _Rewriter, x: str, axes: list[int], ty: TensorType, keep: TensorType) -> str:
    """(x - mean) / sqrt(var + epsilon) over `axes`, statistics in float64;
    the replaced node's outputs 1 and 2 (mean, 1 / std) where it has them."""
    ax = r.const(axes, "int64")
    mean = r.op("ReduceMean", [x, ax], keep, r.output(1), {"keepdims": 1})
    centred = r.op("Sub", [x, mean], ty)
    var = r.op("ReduceMean", [r.op("Mul", [centred, centred], ty), ax], keep, None, {"keepdims": 1})
    std = r.op("Sqrt", [r.op("Add", [var, r.const(r.attr("epsilon", 1e-5))], keep)], keep)
    if r.output(2):
        inv = r.op("Reciprocal", [std], keep, out=r.output(2))
        return r.op("Mul", [centred, inv], ty)
    return r.op("Div", [centred, std], ty)


@_exact("LayerNormalization")
def _layer_norm(r: _Rewriter) -> list[Node] | None:
    """Standard ops in float64 (LayerNormalization's statistics are float32 by
    default, stash_type 1, and onnx.reference takes no other)."""
    x, scale, *bias = r.node.inputs
    ty = r.ty(x)
    rank = len(ty.shape)
    axis = r.node.int_attr("axis", -1) % rank
    keep = TensorType(ty.dtype, (*ty.shape[:axis], *[1] * (rank - axis)))
    normed = _normalised(r, x, list(range(axis, rank)), ty, keep)
    y = r.node.outputs[0]
    if bias and bias[0]:
        r.op("Add", [r.op("Mul", [normed, scale], ty), bias[0]], ty, out=y)
    else:
        r.op("Mul", [normed, scale], ty, out=y)
    return r.made


@_exact("GroupNormalization")
def _group_norm(r: _Rewriter) -> list[Node] | None:
    """Standard ops in float64 (GroupNormalization's statistics are float32 by
    default, and its ONNX function computes E[x^2] - E[x]^2)."""
    if r.node.attrs.get("channels_last"):
        return None  # only on graphs lowered for a target, never in a log
    x, scale, bias = r.node.inputs
    ty = r.ty(x)
    channels, groups = ty.shape[1], r.node.int_attr("num_groups")
    if not isinstance(channels, int):
        return None
    rest: Dim = channels // groups
    for d in ty.shape[2:]:
        rest = dim_mul(rest, d)
    grouped = TensorType(ty.dtype, (ty.shape[0], groups, rest))
    keep = TensorType(ty.dtype, (ty.shape[0], groups, 1))
    xg = r.op("Reshape", [x, r.const([0, groups, -1], "int64")], grouped)
    normed = _normalised(r, xg, [2], grouped, keep)
    shape = r.op("Shape", [x], TensorType("int64", (len(ty.shape),)))
    back = r.op("Reshape", [normed, shape], ty)
    per_channel = r.const([channels] + [1] * (len(ty.shape) - 2), "int64")
    affine = TensorType(ty.dtype, (channels, *[1] * (len(ty.shape) - 2)))
    s = r.op("Reshape", [scale, per_channel], affine)
    b = r.op("Reshape", [bias, per_channel], affine)
    r.op("Add", [r.op("Mul", [back, s], ty), b], ty, out=r.node.outputs[0])
    return r.made


@_exact("Gelu")
def _gelu(r: _Rewriter) -> list[Node] | None:
    """x * 0.5 * (1 + erf(x / sqrt(2))), or with tanh's approximation
    0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))), as torch's kernel
    writes them: ONNX's Gelu function body holds its constants as float32."""
    x, y = r.node.inputs[0], r.node.outputs[0]
    ty = r.ty(y)
    half = r.op("Mul", [x, r.const(0.5)], ty)
    if r.node.attrs.get("approximate", "none") == "tanh":
        cube = r.op("Mul", [r.op("Mul", [x, x], ty), x], ty)
        inner = r.op("Add", [x, r.op("Mul", [cube, r.const(0.044715)], ty)], ty)
        beta = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
        curve = r.op("Tanh", [r.op("Mul", [inner, r.const(beta)], ty)], ty)
    else:
        curve = r.op("Erf", [r.op("Mul", [x, r.const(math.sqrt(0.5))], ty)], ty)
    r.op("Mul", [half, r.op("Add", [curve, r.const(1.0)], ty)], ty, out=y)
    return r.made
