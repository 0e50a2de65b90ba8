"""Fusions the adapters apply to every graph they record, before hashing: the
adapter rules write each source op as plain IR, and these rules fold the
patterns into the op a target runs fused. A stored log holds the fused form.

Each adapter names the rewrites it applies (``tracelog.adapters.builder.
use_rewrites``): the rules here hold for any graph, but a log must stay what
the adapter recorded before, so an adapter opts in per rule set.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tracelog.ir import AttrValue, Dim, Node, TensorType, dim_scale, is_symbolic
from tracelog.ops import TRACELOG_DOMAIN
from tracelog.passes.rewrite import Match, P, Rewrites


def _rank2(m: Match, *values: str) -> bool:
    return all(len(m.type(v).shape) == 2 for v in values)


def _matmul_transposed_b(m: Match) -> list[Node] | None:
    if not _rank2(m, m["a"], m["w"]):
        return None
    return [m.node_as("Gemm", [m["a"], m["w"]], transB=1)]


def _gemm_transposed_b(m: Match) -> list[Node] | None:
    gemm = m.root
    if gemm.attrs.get("transA", 0) or gemm.attrs.get("transB", 0):
        return None
    return [m.node_as("Gemm", [m["a"], m["w"], *gemm.inputs[2:]], gemm.attrs, transB=1)]


# The transpose stays where something else reads it (shared=True): torch's
# `t` of a weight feeds the matmul and, now and then, other ops too.
_W_T = P("Transpose", "w", perm=[1, 0], shared=True)

GEMM_TRANSPOSES = Rewrites(
    [
        # MatMul(a, Transpose(w, [1, 0])), both 2-D -> Gemm(a, w, transB=1)  (aten t + mm)
        (P("MatMul", "a", _W_T), _matmul_transposed_b),
        # Gemm(a, Transpose(w, [1, 0]), c?) -> Gemm(a, w, c?, transB=1)  (aten t + addmm)
        (P("Gemm", "a", _W_T, ...), _gemm_transposed_b),
    ]
)


def _repeat_as_resize(m: Match) -> list[Node] | None:
    """x with a new axis a + 1, tiled r times there, the two axes merged: each
    element along axis a repeated r times (tf.repeat; Keras' nearest
    UpSampling). That is ONNX Resize nearest over axis a at scale r with
    asymmetric coordinates and floor: out[i] = x[floor(i / r)]."""
    x, out = m.type(m["x"]), m.type(m.root.outputs[0])
    given, reps = m.ints(m["axis"]), m.ints(m["reps"])
    rank = len(x.shape)
    if given is None or reps is None or len(given) != 1 or len(reps) != rank + 1:
        return None
    a = given[0] % (rank + 1) - 1
    r = reps[a + 1] if a >= 0 else 0
    if r < 2 or any(k != 1 for i, k in enumerate(reps) if i != a + 1):
        return None
    d = x.shape[a]
    merged = dim_scale(d, r) if is_symbolic(d) else int(d) * r
    if tuple(out.shape) != (*x.shape[:a], merged, *x.shape[a + 1 :]) or out.dtype != x.dtype:
        return None
    scales = m.const([float(r)], "float32")
    return [m.node_as("Resize", [m["x"], "", scales], _NEAREST_FLOOR, axes=[a])]


_NEAREST_FLOOR = {
    "mode": "nearest",
    "coordinate_transformation_mode": "asymmetric",
    "nearest_mode": "floor",
}


def _resizes_merged(m: Match) -> list[Node] | None:
    """Nearest resizes (by scales) of disjoint axes, one after the other: one
    Resize of both sets of axes (each axis is resized on its own)."""
    inner, outer = m.nodes["inner"], m.root
    if any(n.attrs.get(k) != v for n in (inner, outer) for k, v in _NEAREST_FLOOR.items()):
        return None
    if set(inner.attrs) != set(outer.attrs) or set(inner.attrs) != {*_NEAREST_FLOOR, "axes"}:
        return None
    rank = len(m.type(m["x"]).shape)
    a1 = [a % rank for a in inner.ints_attr("axes")]
    a2 = [a % rank for a in outer.ints_attr("axes")]
    s1, s2 = m.floats(m["s1"]), m.floats(m["s2"])
    if s1 is None or s2 is None or set(a1) & set(a2) or len(s1) != len(a1) or len(s2) != len(a2):
        return None
    axes, scales = zip(*sorted(zip(a1 + a2, s1 + s2, strict=True)), strict=True)
    merged = m.const(list(scales), "float32")
    return [m.node_as("Resize", [m["x"], "", merged], _NEAREST_FLOOR, axes=list(axes))]


REPEATS = Rewrites(
    [
        # Reshape(Tile(Unsqueeze(x, [a + 1]), r at a + 1), x's shape with axis a * r)
        #   -> Resize(x, scales=[r], axes=[a], nearest, asymmetric, floor)   (tf.repeat)
        (P("Reshape", P("Tile", P("Unsqueeze", "x", "axis"), "reps"), None), _repeat_as_resize),
        # Resize(Resize(x, s1, axes A), s2, axes B), nearest, A and B disjoint
        #   -> Resize(x, s1 + s2, axes A + B)   (UpSampling2D: a repeat per axis)
        (
            P("Resize", P("Resize", "x", None, "s1", name="inner"), None, "s2"),
            _resizes_merged,
        ),
    ]
)


def _softmax_axis(m: Match) -> list[Node] | None:
    """Transpose(p) -> (Log)Softmax over the last axis -> Transpose(p^-1):
    the softmax over axis p[-1] of x (TF's softmax over a non-last axis)."""
    p, back = m.nodes["into"].ints_attr("perm"), m.root.ints_attr("perm")
    sm = m.nodes["softmax"]
    rank = len(p)
    if len(back) != rank or any(p[back[i]] != i for i in range(rank)):
        return None
    if sm.int_attr("axis", -1) % rank != rank - 1:
        return None
    return [m.node_as(sm.op, [m["x"]], axis=p[-1])]


SOFTMAX_AXES = Rewrites(
    [
        # Transpose(Softmax(Transpose(x, p), axis=-1), p^-1) -> Softmax(x, axis=p[-1])
        (
            P(
                "Transpose",
                P(
                    ("Softmax", "LogSoftmax"),
                    P("Transpose", "x", name="into"),
                    name="softmax",
                ),
            ),
            _softmax_axis,
        ),
    ]
)


# -- high-level ops written out: normalisations, GELU, softmax (issue 15) --------------
# Each rule checks the dataflow's meaning (axes, constants, epsilon), never module
# names. Constants are compared exactly: a float32-rounded constant (Keras' GELU holds
# float32(1/sqrt 2)) means a different function in the float64 translation check, so
# those patterns stay written out.


def _scalar(m: Match, value: str) -> float | None:
    """A constant input holding one number, as a float; None otherwise."""
    found = m.floats(value)
    return found[0] if found is not None and len(found) == 1 else None


def _is(m: Match, value: str, number: float) -> bool:
    got = _scalar(m, value)
    return got is not None and got == number


def _made_by(m: Match, value: str, op: str, *, single: bool = True) -> Node | None:
    """The node of op `op` computing `value` (read once, unless not `single`)."""
    n = m.producer(value)
    if n is None or n.op != op or n.domain or (single and m.uses(value) != 1):
        return None
    return n


def _axes(m: Match, node: Node, rank: int) -> list[int] | None:
    """A reduction's constant axes, sorted and non-negative; None if computed or absent."""
    if len(node.inputs) < 2 or node.int_attr("keepdims", 1) != 1:
        return None
    given = m.ints(node.inputs[1])
    return None if not given else sorted({a % rank for a in given})


def _centred(m: Match, value: str, x: str, mean: str) -> Node | None:
    """`value` = x - mean, or x - StopGradient(mean) (Keras' moments)."""
    sub = m.producer(value)
    if sub is None or sub.op != "Sub" or sub.inputs[0] != x:
        return None
    if sub.inputs[1] == mean:
        return sub
    stop = m.producer(sub.inputs[1])
    if stop is not None and stop.op == "StopGradient" and stop.inputs == [mean]:
        m.absorb(stop)
        return sub
    return None


def _moments(m: Match, x: str, mean: str, var: str) -> list[int] | None:
    """mean = ReduceMean(x, axes, keepdims) and var = ReduceMean((x - mean)^2, axes,
    keepdims), the square a Mul or a Pow by 2: the axes; None where any part differs.
    The nodes are absorbed (they go where nothing else reads them)."""
    rank = len(m.type(x).shape)
    rm, rv = m.producer(mean), m.producer(var)
    if rm is None or rv is None or rm.op != "ReduceMean" or rv.op != "ReduceMean":
        return None
    axes = _axes(m, rm, rank)
    if rm.inputs[0] != x or axes is None or _axes(m, rv, rank) != axes:
        return None
    sq = m.producer(rv.inputs[0])
    if sq is None or sq.op not in ("Mul", "Pow"):
        return None
    if sq.op == "Mul" and sq.inputs[0] != sq.inputs[1]:
        return None
    if sq.op == "Pow" and not _is(m, sq.inputs[1], 2.0):
        return None
    centred = _centred(m, sq.inputs[0], x, mean)
    if centred is None:
        return None
    m.absorb(centred, sq, rv, rm)
    return axes


def _channel_perm(rank: int, channel: int) -> list[int] | None:
    """The perm that brings `channel` to axis 1 (ONNX's channels-first ops); None
    where it is already there."""
    if channel == 1:
        return None
    return [0, channel, *[d for d in range(1, rank) if d != channel]]


def _channels_first(
    m: Match, x: str, channel: int, build: Callable[[str, str], list[Node]]
) -> list[Node]:
    """`build(x', y')` for a channels-first op, between a Transpose of x moving
    `channel` to axis 1 and one moving it back to the root's output (the layout
    pass cancels such pairs for channels-first targets, and makes them NHWC ops
    for TensorFlow, as it does for Conv)."""
    perm = _channel_perm(len(m.type(x).shape), channel)
    y = m.root.outputs[0]
    if perm is None:
        return build(x, y)
    back = [perm.index(d) for d in range(len(perm))]
    xt = m.fresh(_permuted(m.type(x), perm))
    yt = m.fresh(_permuted(m.type(y), perm))
    return [
        Node("Transpose", [x], [xt], {"perm": perm}),
        *build(xt, yt),
        Node("Transpose", [yt], [y], {"perm": back}),
    ]


def _permuted(ty: TensorType, perm: list[int]) -> TensorType:
    return TensorType(ty.dtype, tuple(ty.shape[p] for p in perm))


def _per_channel(m: Match, value: str, channels: Dim) -> str | None:
    """A per-channel parameter: `value` of shape [C], or a Reshape of one (Keras
    reshapes gamma and beta to broadcast)."""
    if tuple(m.type(value).shape) == (channels,):
        return value
    reshape = _made_by(m, value, "Reshape", single=False)
    if reshape is not None and tuple(m.type(reshape.inputs[0]).shape) == (channels,):
        m.absorb(reshape)
        return reshape.inputs[0]
    return None


def _trailing(m: Match, value: str, shape: tuple[Dim, ...]) -> str | None:
    """A layer-norm parameter of the normalised shape, or a Reshape of one."""
    if tuple(m.type(value).shape) == shape:
        return value
    reshape = _made_by(m, value, "Reshape", single=False)
    if reshape is not None and tuple(m.type(reshape.inputs[0]).shape) == shape:
        m.absorb(reshape)
        return reshape.inputs[0]
    return None


def _moving_average(m: Match, stat: str, used: Node) -> tuple[str, float, float, str] | None:
    """Keras' update of a moving statistic from the batch's `stat` (read by `used`
    in the output's formula and by nothing else but the update):
    Add(Mul(moving, decay), Mul(stat, momentum)) -> (moving, decay, momentum, new)."""
    readers = [n for n in m.readers(stat) if n is not used]
    if len(readers) != 1 or readers[0].op != "Mul" or readers[0].inputs[0] != stat:
        return None
    part = readers[0]
    momentum = _scalar(m, part.inputs[1])
    add = m.readers(part.outputs[0])
    if (
        momentum is None
        or len(add) != 1
        or add[0].op != "Add"
        or add[0].inputs[1] != part.outputs[0]
    ):
        return None
    old = _made_by(m, add[0].inputs[0], "Mul")
    if old is None or m.graph.values[old.inputs[0]].kind not in ("buffer", "param"):
        return None
    decay = _scalar(m, old.inputs[1])
    new = add[0].outputs[0]
    if decay is None or m.read_before_root(new):
        return None
    m.absorb(part, old, add[0])
    return old.inputs[0], decay, momentum, new


def _batch_stat(m: Match, value: str, rank: int) -> tuple[str, list[int]] | None:
    """`value` = Squeeze(s, axes) of a keep-dims batch statistic s: (s, axes)."""
    sq = m.producer(value)
    if sq is None or sq.op != "Squeeze" or len(sq.inputs) != 2:
        return None
    axes = m.ints(sq.inputs[1])
    if axes is None:
        return None
    m.absorb(sq)
    return sq.inputs[0], sorted(a % rank for a in axes)


def _unbroadcast(m: Match, value: str) -> tuple[str, Node | None, int | None]:
    """A statistic Keras reshaped to broadcast ([1, 1, 1, C] for axis=3, not -1):
    (the [C] value, the Reshape, the channel axis); `value` itself where not reshaped."""
    reshape = _made_by(m, value, "Reshape")
    if reshape is None or len(m.type(reshape.inputs[0]).shape) != 1:
        return value, None, None
    shape = m.type(value).shape
    wide = [d for d, k in enumerate(shape) if k != 1]
    if len(wide) != 1 or shape[wide[0]] != m.type(reshape.inputs[0]).shape[0]:
        return value, None, None
    m.absorb(reshape)
    return reshape.inputs[0], reshape, wide[0]


def _keras_batch_norm(m: Match) -> list[Node] | None:
    """tf.nn.batch_normalization (x * inv + (beta - mean * inv), inv = gamma *
    rsqrt(var + eps)) per channel. With the batch's moments and Keras' moving
    averages of them, BatchNormTraining (decay, momentum and the biased variance as
    Keras updates); with the moving statistics themselves, BatchNormalization."""
    gamma, beta, eps = m["gamma"], m["beta"], _scalar(m, m["eps"])
    x = m["x"]
    ty = m.type(x)
    rank = len(ty.shape)
    mean, mean_reshape, mean_axis = _unbroadcast(m, m["mean"])
    var, var_reshape, var_axis = _unbroadcast(m, m["var"])
    if eps is None or rank < 2 or mean_axis != var_axis:
        return None
    kinds = (m.graph.values[mean].kind, m.graph.values[var].kind)
    if kinds == ("buffer", "buffer"):  # inference: the moving statistics
        channel = rank - 1 if mean_axis is None else mean_axis
        stats = (mean, var)
        train = None
    else:
        sm, sv = _batch_stat(m, mean, rank), _batch_stat(m, var, rank)
        if sm is None or sv is None or sm[1] != sv[1]:
            return None
        axes = _moments(m, x, sm[0], sv[0])
        if axes is None or axes != sm[1] or len(axes) != rank - 1:
            return None
        channel = next(d for d in range(rank) if d not in axes)
        if mean_axis is not None and mean_axis != channel:
            return None
        um = _moving_average(m, mean, mean_reshape or m.nodes["mean_inv"])
        uv = _moving_average(m, var, var_reshape or m.nodes["var_eps"])
        if um is None or uv is None or um[1:3] != uv[1:3]:
            return None
        stats = (um[0], uv[0])
        train = (um, uv)
    if channel is None or channel == 0:
        return None
    c = ty.shape[channel]
    scale, bias = _per_channel(m, gamma, c), _per_channel(m, beta, c)
    if scale is None or bias is None or tuple(m.type(stats[0]).shape) != (c,):
        return None
    inputs = [scale, bias, *stats]
    if train is None:
        return _channels_first(
            m,
            x,
            channel,
            lambda xt, yt: [Node("BatchNormalization", [xt, *inputs], [yt], {"epsilon": eps})],
        )
    (_, decay, momentum, new_mean), (_, _, _, new_var) = train
    attrs: dict[str, AttrValue] = {
        "epsilon": eps,
        "momentum": momentum,
        "decay": decay,
        "unbiased": 0,
        "axes": [0, *range(2, rank)],
    }
    return _channels_first(
        m,
        x,
        channel,
        lambda xt, yt: [
            Node(
                "BatchNormTraining", [xt, *inputs], [yt, new_mean, new_var], attrs, TRACELOG_DOMAIN
            )
        ],
    )


def _keras_layer_norm(m: Match) -> list[Node] | None:
    """Keras' layer norm (x * inv + (-mean * inv + beta), inv = gamma * rsqrt(var +
    eps), the moments over trailing axes) -> LayerNormalization(axis = the first)."""
    x, eps = m["x"], _scalar(m, m["eps"])
    ty = m.type(x)
    axes = _moments(m, x, m["mean"], m["var"])
    if eps is None or not axes or axes != list(range(axes[0], len(ty.shape))) or axes[0] == 0:
        return None
    shape = tuple(ty.shape[axes[0] :])
    scale, bias = _trailing(m, m["gamma"], shape), _trailing(m, m["beta"], shape)
    if scale is None or bias is None:
        return None
    return [
        m.node_as("LayerNormalization", [x, scale, bias], axis=axes[0] - len(ty.shape), epsilon=eps)
    ]


def _keras_group_norm(m: Match) -> list[Node] | None:
    """Keras' group norm: x reshaped to [..., G, C / G, ...] at its channel axis,
    normalised as layer norm is over all but the batch and group axes, reshaped
    back -> GroupNormalization(num_groups = G), channels first."""
    grouped, eps = m["xg"], _scalar(m, m["eps"])
    split = _made_by(m, grouped, "Reshape", single=False)
    if split is None or eps is None:
        return None
    x = split.inputs[0]
    ty, gty = m.type(x), m.type(grouped)
    rank = len(ty.shape)
    if tuple(m.type(m.root.outputs[0]).shape) != tuple(ty.shape) or len(gty.shape) != rank + 1:
        return None
    channel = next((d for d in range(1, rank) if ty.shape[d] != gty.shape[d]), rank - 1)
    c, groups, per = ty.shape[channel], gty.shape[channel], gty.shape[channel + 1]
    if not (isinstance(c, int) and isinstance(groups, int) and isinstance(per, int)):
        return None
    if groups * per != c or tuple(gty.shape[channel + 2 :]) != tuple(ty.shape[channel + 1 :]):
        return None
    axes = _moments(m, grouped, m["mean"], m["var"])
    if axes != [d for d in range(1, rank + 1) if d != channel]:
        return None
    scale, bias = _per_channel(m, m["gamma"], c), _per_channel(m, m["beta"], c)
    if scale is None or bias is None:
        return None
    m.absorb(split)
    attrs: dict[str, AttrValue] = {"num_groups": groups, "epsilon": eps}
    return _channels_first(
        m,
        x,
        channel,
        lambda xt, yt: [Node("GroupNormalization", [xt, scale, bias], [yt], attrs)],
    )


def _layer_norm_divided(m: Match) -> list[Node] | None:
    """A layer norm written out: w * ((x - mean) / sqrt(var + eps)) + b, the
    moments over trailing axes (BERT's and many a hand-written LayerNorm) ->
    LayerNormalization."""
    x, eps = m["x"], _scalar(m, m["eps"])
    centred = m.nodes["centred"]
    if eps is None or centred.inputs[0] != x:
        return None
    ty = m.type(x)
    axes = _moments(m, x, m["mean"], m["var"])
    if not axes or axes != list(range(axes[0], len(ty.shape))) or axes[0] == 0:
        return None
    shape = tuple(ty.shape[axes[0] :])
    if tuple(m.type(m["w"]).shape) != shape or tuple(m.type(m["b"]).shape) != shape:
        return None
    return [
        m.node_as(
            "LayerNormalization", [x, m["w"], m["b"]], axis=axes[0] - len(ty.shape), epsilon=eps
        )
    ]


def _single_axis(m: Match, node: Node, rank: int) -> int | None:
    axes = _axes(m, node, rank)
    return axes[0] if axes is not None and len(axes) == 1 else None


def _shifted(m: Match, value: str, axis: int) -> str | None:
    """`value` = x - ReduceMax(x, [axis]) (or x itself): x; None otherwise. The
    shift by the maximum leaves softmax unchanged in exact arithmetic."""
    sub = m.producer(value)
    if sub is None or sub.op != "Sub":
        return value
    top = m.producer(sub.inputs[1])
    if top is not None and top.op == "StopGradient":
        m.absorb(top)
        top = m.producer(top.inputs[0])
    x = sub.inputs[0]
    if top is None or top.op != "ReduceMax" or top.inputs[0] != x:
        return value
    if _single_axis(m, top, len(m.type(x).shape)) != axis:
        return None
    m.absorb(sub, top)
    return x


def _softmax_divided(m: Match) -> list[Node] | None:
    """exp(u) / sum(exp(u), [axis]), u = x - max(x, [axis]) or x -> Softmax(x, axis)."""
    e, total = m["e"], m.nodes["sum"]
    rank = len(m.type(e).shape)
    axis = _single_axis(m, total, rank)
    exp = m.producer(e)
    if axis is None or exp is None or exp.op != "Exp" or m.uses(e) != 2:
        return None
    x = _shifted(m, exp.inputs[0], axis)
    if x is None:
        return None
    m.absorb(exp)
    return [m.node_as("Softmax", [x], axis=axis - rank)]


def _log_softmax_written(m: Match) -> list[Node] | None:
    """u - log(sum(exp(u), [axis])), u = x - max(x, [axis]) -> LogSoftmax(x, axis)."""
    u, total = m["u"], m.nodes["sum"]
    rank = len(m.type(u).shape)
    axis = _single_axis(m, total, rank)
    if axis is None:
        return None
    x = _shifted(m, u, axis)
    if x is None:
        return None
    return [m.node_as("LogSoftmax", [x], axis=axis - rank)]


def _flat(m: Match, value: str, op: str, absorbed: list[Node]) -> list[str]:
    """The operands of a chain of `op` (Mul or Add) nodes read once each, left to
    right; the chain's nodes go to `absorbed`."""
    n = m.producer(value)
    if n is None or n.op != op or n.domain or m.uses(value) != 1:
        return [value]
    absorbed.append(n)
    return [v for i in n.inputs for v in _flat(m, i, op, absorbed)]


def _split(m: Match, values: list[str], *numbers: float) -> list[str] | None:
    """`values` less one constant equal to each of `numbers`; None if one is missing."""
    rest = list(values)
    for k in numbers:
        found = next((v for v in rest if _is(m, v, k)), None)
        if found is None:
            return None
        rest.remove(found)
    return rest


_SQRT_HALF, _SQRT2 = math.sqrt(0.5), math.sqrt(2.0)
_TANH_SCALE = math.sqrt(2.0 / math.pi)


def _erf_curve(m: Match, value: str, seen: list[Node]) -> str | None:
    """erf(x / sqrt 2) or erf(x * sqrt(1/2)): x."""
    erf = m.producer(value)
    if erf is None or erf.op != "Erf" or m.uses(value) != 1:
        return None
    arg = m.producer(erf.inputs[0])
    if arg is None or m.uses(erf.inputs[0]) != 1:
        return None
    seen += [erf, arg]
    if arg.op == "Div" and _is(m, arg.inputs[1], _SQRT2):
        return arg.inputs[0]
    rest = _split(m, arg.inputs, _SQRT_HALF) if arg.op == "Mul" else None
    return rest[0] if rest is not None and len(rest) == 1 else None


def _tanh_curve(m: Match, value: str, seen: list[Node]) -> str | None:
    """tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)), the cube a Pow by 3 or x * x * x: x."""
    tanh = m.producer(value)
    if tanh is None or tanh.op != "Tanh" or m.uses(value) != 1:
        return None
    seen.append(tanh)
    outer = _split(m, _flat(m, tanh.inputs[0], "Mul", seen), _TANH_SCALE)
    if outer is None or len(outer) != 1:
        return None
    terms = _flat(m, outer[0], "Add", seen)
    if len(terms) != 2:
        return None
    for x, other in (terms, terms[::-1]):
        cubic = _split(m, _flat(m, other, "Mul", seen), 0.044715)
        if cubic is None:
            continue
        if len(cubic) == 3 and cubic == [x, x, x]:
            return x
        power = m.producer(cubic[0]) if len(cubic) == 1 else None
        if power is not None and power.op == "Pow" and power.inputs[0] == x:
            if _is(m, power.inputs[1], 3.0) and m.uses(cubic[0]) == 1:
                seen.append(power)
                return x
    return None


def _gelu_written(m: Match) -> list[Node] | None:
    """0.5 * x * (1 + erf(x / sqrt 2)) -> Gelu; 0.5 * x * (1 + tanh(sqrt(2 / pi) *
    (x + 0.044715 x^3))) -> Gelu(approximate="tanh") (HF's gelu_new), the factors
    in any order; every constant exactly the double the formula names."""
    seen: list[Node] = []
    factors = _split(m, [v for i in m.root.inputs for v in _flat(m, i, "Mul", seen)], 0.5)
    if factors is None or len(factors) != 2:
        return None
    for x, other in (factors, factors[::-1]):
        inner: list[Node] = []
        one = _split(m, _flat(m, other, "Add", inner), 1.0)
        if one is None or len(one) != 1:
            continue
        if _erf_curve(m, one[0], inner) == x:
            approximate = "none"
        elif _tanh_curve(m, one[0], inner) == x:
            approximate = "tanh"
        else:
            continue
        m.absorb(*seen, *inner)
        attrs = {"approximate": approximate} if approximate == "tanh" else {}
        return [m.node_as("Gelu", [x], attrs)]
    return None


# Keras' normalisations share inv = gamma * rsqrt(var + eps) (tf.Rsqrt records as
# Reciprocal(Sqrt)); the pattern reads it twice, so it may have other readers.
def _inv(name: str) -> P:
    return P(
        "Mul",
        P("Reciprocal", P("Sqrt", P("Add", "var", "eps", name="var_eps"))),
        "gamma",
        shared=True,
        name=name,
    )


NORMALIZATIONS = Rewrites(
    [
        # Add(Mul(x, inv), Sub(beta, Mul(mean, inv)))  (tf.nn.batch_normalization:
        #   Keras BatchNormalization) -> BatchNormTraining / BatchNormalization
        (
            P(
                "Add",
                P("Mul", "x", _inv("inv")),
                P("Sub", "beta", P("Mul", "mean", _inv("inv"), name="mean_inv")),
            ),
            _keras_batch_norm,
        ),
        # Reshape(Add(Mul(xg, inv), Add(Mul(Neg(mean), inv), beta)), shape of x)
        #   (Keras GroupNormalization) -> GroupNormalization
        (
            P(
                "Reshape",
                P(
                    "Add",
                    P("Mul", "xg", _inv("inv")),
                    P("Add", P("Mul", P("Neg", "mean"), _inv("inv")), "beta"),
                ),
                None,
            ),
            _keras_group_norm,
        ),
        # Add(Mul(x, inv), Add(Mul(Neg(mean), inv), beta))  (Keras LayerNormalization)
        #   -> LayerNormalization
        (
            P(
                "Add",
                P("Mul", "x", _inv("inv")),
                P("Add", P("Mul", P("Neg", "mean"), _inv("inv")), "beta"),
            ),
            _keras_layer_norm,
        ),
    ]
)

WRITTEN_OUT = Rewrites(
    [
        # Add(Mul(w, Div(Sub(x, mean), Sqrt(Add(var, eps)))), b) -> LayerNormalization
        (
            P(
                "Add",
                P(
                    "Mul",
                    "w",
                    P(
                        "Div",
                        P("Sub", "x", "mean", name="centred"),
                        P("Sqrt", P("Add", "var", "eps")),
                    ),
                ),
                "b",
            ),
            _layer_norm_divided,
        ),
        # Div(e, ReduceSum(e, [axis])), e = Exp(x - ReduceMax(x, [axis])) -> Softmax
        (P("Div", "e", P("ReduceSum", "e", None, name="sum")), _softmax_divided),
        # Sub(u, Log(ReduceSum(Exp(u), [axis]))), u = x - ReduceMax(x) -> LogSoftmax
        (
            P("Sub", "u", P("Log", P("ReduceSum", P("Exp", "u"), None, name="sum"))),
            _log_softmax_written,
        ),
        # 0.5 * x * (1 + erf(x / sqrt 2)) or its tanh form -> Gelu
        (P("Mul", None, None), _gelu_written),
    ]
)


# -- scaled dot-product attention written out (issue 15) ---------------------------------
# Keras' ops.dot_product_attention (MultiHeadAttention without dropout) on TensorFlow:
# Einsum(BTNH,BSNH->BNTS) * scale, the mask applied with Where(mask, scores, a large
# negative), Softmax, Einsum(BNTS,BSNH->BTNH). Equations are compared with their letters
# renamed in order of appearance.
_SCORES_EQ = "abcd,aecd->acbe"
_MIX_EQ = "abcd,adbe->acbe"
_HEADS_SECOND = [0, 2, 1, 3]  # [batch, length, heads, dim] <-> [batch, heads, length, dim]


def _canonical(equation: object) -> str:
    letters: dict[str, str] = {}
    out = []
    for ch in str(equation).replace(" ", ""):
        if ch.isalpha():
            ch = letters.setdefault(ch, "abcdefghijklmnopqrstuvwxyz"[len(letters)])
        out.append(ch)
    return "".join(out)


def _const_bool(m: Match, value: str, seen: list[Node]) -> tuple[str, np.ndarray] | None:
    """A boolean mask the graph computes from constants alone (a constant, or an
    Unsqueeze of one), with the nodes read; and its data, shaped as its type."""
    ty = m.type(value)
    if ty.dtype != "bool" or any(is_symbolic(d) for d in ty.shape):
        return None
    node = m.producer(value)
    source = value
    if node is not None:
        if node.op != "Unsqueeze" or node.domain:
            return None
        seen.append(node)  # it goes where the fused op no longer reads it (a causal mask)
        source = node.inputs[0]
    v = m.graph.values[source]
    if v.kind != "const" or v.const is None or v.const.data is None:
        return None
    return value, np.asarray(v.const.data, dtype=bool).reshape([int(d) for d in ty.shape])


def _all_true(m: Match, value: str, seen: list[Node]) -> bool:
    """Expand(True, shape): Keras' ones_like mask, with the Shape and Casts feeding it."""
    node = m.producer(value)
    if node is None or node.op != "Expand" or m.uses(value) != 1:
        return False
    fill = m.graph.values[node.inputs[0]]
    if fill.kind != "const" or fill.const is None or not np.all(np.asarray(fill.const.data)):
        return False
    seen.append(node)
    shape = node.inputs[1]
    while (n := m.producer(shape)) is not None and n.op in ("Cast", "Shape") and m.uses(shape) == 1:
        seen.append(n)
        shape = n.inputs[0]
    return True


def _attention_mask(m: Match, cond: str, seen: list[Node]) -> tuple[str, np.ndarray] | None:
    """The constant boolean mask a Where applies (True: the key is seen), alone
    or And-ed with Keras' all-True mask."""
    node = m.producer(cond)
    if node is not None and node.op == "And" and m.uses(cond) == 1:
        for ones, mask in (node.inputs, node.inputs[::-1]):
            inner: list[Node] = []
            if _all_true(m, ones, inner):
                found = _const_bool(m, mask, seen)
                if found is not None:
                    seen += [node, *inner]
                return found
        return None
    return _const_bool(m, cond, seen)


_Mask = tuple[str, np.ndarray]  # a boolean mask's value and its constant data


def _attention_written(m: Match) -> list[Node] | None:
    """Einsum(Softmax(Einsum(q, k) * scale [masked]), v) in Keras' layout ->
    Transposes around tracelog.Attention. A mask is fused only where it is a
    constant under which every query sees a key: there, masking with a large
    negative (Keras) and with -inf (the op) give the same probabilities and
    gradients; a fully masked row would differ (Keras gives it the uniform
    average), so a data-dependent mask stays written out."""
    sm = m.nodes["softmax"]
    if _canonical(m.root.attrs.get("equation")) != _MIX_EQ:
        return None
    if sm.int_attr("axis", -1) not in (-1, 3):
        return None
    seen: list[Node] = []
    masked = _masked_scores(m, m["s"], seen)
    if masked is None:
        return None
    scores, reader, mask = masked
    product = _scaled_product(m, scores, reader, seen)
    if product is None:
        return None
    q, k, scale = product
    v = m["v"]
    dt = m.type(q).dtype
    if any(m.type(t).dtype != dt or len(m.type(t).shape) != 4 for t in (q, k, v)):
        return None
    m.absorb(*seen)
    return _attention_heads_second(m, [q, k, v], scale, mask)


def _masked_scores(m: Match, value: str, seen: list[Node]) -> tuple[str, Node, _Mask | None] | None:
    """The scores before a Where that masks them with a large negative (and the
    mask), or the softmax's input as it is; with the node that reads them."""
    where = m.producer(value)
    if where is None or where.op != "Where" or m.uses(value) != 1:
        return value, m.nodes["softmax"], None
    fill = _scalar(m, where.inputs[2])
    if fill is None or fill > -1e30:  # not a mask: a large negative or -inf fills it
        return None
    mask = _attention_mask(m, where.inputs[0], seen)
    if mask is None or not mask[1].any(axis=-1).all():
        return None
    seen.append(where)
    return where.inputs[1], where, mask


def _scaled_product(
    m: Match, scores: str, reader: Node, seen: list[Node]
) -> tuple[str, str, float] | None:
    """q, k and the scale of scores = Einsum(q, k) * scale (Keras' BTNH,BSNH->BNTS),
    read by `reader` and by the Shape of Keras' all-True mask (in seen) alone."""
    mul = m.producer(scores)
    others = [r for r in m.readers(scores) if r is not reader and not any(r is n for n in seen)]
    if mul is None or mul.op != "Mul" or others or m.is_output(scores):
        return None
    for e, k in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
        scale, product = _scalar(m, k), _made_by(m, e, "Einsum")
        if scale is not None and product is not None:
            if _canonical(product.attrs.get("equation")) != _SCORES_EQ:
                return None
            seen += [mul, product]
            return product.inputs[0], product.inputs[1], scale
    return None


def _attention_heads_second(
    m: Match, qkv: list[str], scale: float, mask: _Mask | None
) -> list[Node]:
    """tracelog.Attention on q, k, v moved to [batch, heads, length, dim], its
    result moved back to the root's output; a causal mask as is_causal, another
    as an additive mask (0 / -inf)."""
    nodes: list[Node] = []
    inputs = []
    for t in qkv:
        ht = m.fresh(_permuted(m.type(t), _HEADS_SECOND))
        nodes.append(Node("Transpose", [t], [ht], {"perm": _HEADS_SECOND}))
        inputs.append(ht)
    causal = 0
    if mask is not None:
        name, keep = mask
        length, keys = keep.shape[-2:]
        tril = np.tril(np.ones((length, keys), dtype=bool))
        if keep.size == length * keys and np.array_equal(keep.reshape(length, keys), tril):
            causal = 1
        else:
            dt = m.type(qkv[0]).dtype
            additive = m.fresh(TensorType(dt, m.type(name).shape))
            zero, ninf = m.const([0.0], dt), m.const([float("-inf")], dt)
            nodes.append(Node("Where", [name, zero, ninf], [additive]))
            inputs.append(additive)
    out = m.root.outputs[0]
    yt = m.fresh(_permuted(m.type(out), _HEADS_SECOND))
    attrs: dict[str, AttrValue] = {"scale": scale, "is_causal": causal}
    nodes.append(Node("Attention", inputs, [yt], attrs, TRACELOG_DOMAIN))
    nodes.append(Node("Transpose", [yt], [out], {"perm": _HEADS_SECOND}))
    return nodes


ATTENTION = Rewrites(
    [
        # Einsum(Softmax(s), v), s = Einsum(q, k) * scale, maybe masked -> tracelog.Attention
        (P("Einsum", P("Softmax", "s", name="softmax"), "v"), _attention_written),
    ]
)
