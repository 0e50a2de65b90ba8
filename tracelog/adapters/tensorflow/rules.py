"""The TF-op table: one rule per TensorFlow op type, each building ONNX-
semantics IR. Keras 3 on the TensorFlow backend writes its layers as these
ops (docs/keras-adapter-notes.md lists what each layer runs). NHWC ops
(Conv2D, pooling) become Transpose + NCHW op + Transpose, since the IR's
convolution is ONNX's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, SupportsInt

import numpy as np

from tracelog.adapters.arith import floor_mod_of, int_floor_div_of, is_int, trunc_of
from tracelog.adapters.builder import Converter, Ctx, NotSupported, use_rewrites
from tracelog.adapters.tape import TArg
from tracelog.ir import TensorType
from tracelog.passes.fusions import ATTENTION, NORMALIZATIONS, REPEATS, SOFTMAX_AXES
from tracelog.registry import Table

TF_OPS: Table[Converter] = Table("tensorflow ops")
# tf.repeat (Unsqueeze + Tile + Reshape) -> Resize nearest; softmax over a non-last
# axis (Transpose + Softmax + Transpose) -> Softmax(axis)
use_rewrites(TF_OPS, REPEATS + SOFTMAX_AXES + NORMALIZATIONS + ATTENTION)
Names = Sequence[str | None]

TO_NCHW = [0, 3, 1, 2]
TO_NHWC = [0, 2, 3, 1]


def attr(ctx: Ctx, name: str, default: object = None) -> object:
    return ctx.rec.kwarg(name, default)


def attr_int(ctx: Ctx, name: str, default: int) -> int:
    """An integer attribute (a bit mask, a count)."""
    return _as_int(ctx, name, attr(ctx, name, default))


def attr_ints(ctx: Ctx, name: str, default: Sequence[int] = ()) -> list[int]:
    """A list-of-ints attribute (strides, paddings, dims); the op callback
    reports an empty list as None."""
    v = attr(ctx, name, default)
    if v is None:
        return []
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"{ctx.rec.op}: attribute {name} is {v!r}, not a list")
    return [_as_int(ctx, name, x) for x in v]


def _as_int(ctx: Ctx, name: str, v: object) -> int:
    if not isinstance(v, SupportsInt):
        raise TypeError(f"{ctx.rec.op}: attribute {name} holds {v!r}, not an integer")
    return int(v)


def _same_dtype(ctx: Ctx, i: int, dtype: str) -> str:
    a = ctx.arg(i)
    n = ctx.t(i)
    if isinstance(a, TArg) and a.dtype != dtype:
        n = ctx.helper("Cast", [n], TensorType(dtype, a.shape), to=dtype)
    return n


# -- aliases -------------------------------------------------------------------------
@TF_OPS.register("tf.Identity", "tf.IdentityN")
def _alias(ctx: Ctx) -> Names:
    return [ctx.t(0)]


@TF_OPS.register("tf.StopGradient")
def _stop_gradient(ctx: Ctx) -> Names:
    return ctx.one("StopGradient", [ctx.t(0)], domain="tracelog")


def _folded(ctx: Ctx, fn: Callable[..., np.ndarray], n_args: int) -> Names | None:
    """The op's output as a constant, when its first n_args arguments are all
    known at recording time (shape and mask arithmetic on literals); None
    otherwise."""
    arrays = [const_array(ctx, i) for i in range(n_args)]
    if any(a is None for a in arrays):
        return None
    out = ctx.out_type()
    value = np.asarray(fn(*arrays)).astype(np.dtype(out.dtype))
    if list(value.shape) != [d for d in out.shape]:
        raise NotSupported(f"{ctx.rec.op} folded to shape {value.shape}, not {out.shape}")
    return [ctx.const(value, out.dtype)]


# -- element-wise ----------------------------------------------------------------------
# integer arithmetic on constants folds (softmax over axis 1 builds its transpose's
# perm from rank - 1 and a Range): numpy computes it exactly as TF does
_INT_FOLDS: dict[str, Callable[..., np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Max": np.maximum,
    "Min": np.minimum,
    "Neg": np.negative,
    "Abs": np.abs,
    "Equal": np.equal,
    "Less": np.less,
    "Greater": np.greater,
}


def _same_op(op: str, arity: int, ctx: Ctx) -> Names:
    """A TF op that is the IR op `op` on its first `arity` inputs."""
    fold = _INT_FOLDS.get(op)
    if fold is not None and all(
        ctx.in_type(i).dtype.startswith(("int", "uint")) for i in range(arity)
    ):
        folded = _folded(ctx, fold, arity)
        if folded is not None:
            return folded
    return ctx.one(op, [ctx.t(i) for i in range(arity)])


_UNARY = {
    "Relu": "Relu",
    "Sigmoid": "Sigmoid",
    "Tanh": "Tanh",
    "Exp": "Exp",
    "Log": "Log",
    "Sqrt": "Sqrt",
    "Neg": "Neg",
    "Abs": "Abs",
    "Erf": "Erf",
    "Reciprocal": "Reciprocal",
    "Softplus": "Softplus",
    "Floor": "Floor",
    "Tan": "Tan",
    "Asin": "Asin",
    "Acos": "Acos",
    "Atan": "Atan",
    "Sinh": "Sinh",
    "Cosh": "Cosh",
    "Asinh": "Asinh",
    "Acosh": "Acosh",
    "Atanh": "Atanh",
    "Round": "Round",  # half to even, as ONNX's
    "IsNan": "IsNaN",
    "IsInf": "IsInf",
}
_BINARY = {
    "AddV2": "Add",
    "Add": "Add",
    "Sub": "Sub",
    "Mul": "Mul",
    "RealDiv": "Div",
    "Maximum": "Max",
    "Minimum": "Min",
    "Pow": "Pow",
    "Equal": "Equal",
    "Less": "Less",
    "Greater": "Greater",
}
for _arity, _ops in ((1, _UNARY), (2, _BINARY)):
    for _tf, _op in _ops.items():
        TF_OPS.add(f"tf.{_tf}", partial(_same_op, _op, _arity))


@TF_OPS.register("tf.AddN")
def _add_n(ctx: Ctx) -> Names:
    # the sum of N same-shaped tensors (tf.nn.compute_average_loss, a
    # distribution strategy's reduction): Add, left to right
    n = len(ctx.rec.args)
    if n == 1:
        return [ctx.t(0)]
    acc = ctx.t(0)
    for i in range(1, n - 1):
        acc = ctx.helper("Add", [acc, ctx.t(i)], ctx.out_type())
    return ctx.one("Add", [acc, ctx.t(n - 1)])


@TF_OPS.register("tf.BiasAdd")
def _bias_add(ctx: Ctx) -> Names:
    fmt = attr(ctx, "data_format", "NHWC")
    if fmt not in ("NHWC", b"NHWC"):
        raise NotSupported("BiasAdd in NCHW")
    return ctx.one("Add", [ctx.t(0), ctx.t(1)])  # the bias broadcasts along the last axis


@TF_OPS.register("tf.DivNoNan")
def _div_no_nan(ctx: Ctx) -> Names:
    # x / y, and 0 where y == 0: Where(y == 0, 0, x / y)
    y = ctx.t(1)
    ty = ctx.out_type()
    zero = ctx.const(0.0, ty.dtype)
    is_zero = ctx.helper("Equal", [y, zero], TensorType("bool", ctx.in_type(1).shape))
    q = ctx.helper("Div", [ctx.t(0), y], ty)
    return ctx.one("Where", [is_zero, zero, q])


@TF_OPS.register("tf.Rsqrt")
def _rsqrt(ctx: Ctx) -> Names:
    return ctx.one("Reciprocal", [ctx.helper("Sqrt", [ctx.t(0)], ctx.out_type())])


@TF_OPS.register("tf.Square")
def _square(ctx: Ctx) -> Names:
    x = ctx.t(0)
    return ctx.one("Mul", [x, x])


@TF_OPS.register("tf.SquaredDifference")
def _squared_difference(ctx: Ctx) -> Names:
    d = ctx.helper("Sub", [ctx.t(0), ctx.t(1)], ctx.out_type())
    return ctx.one("Mul", [d, d])


@TF_OPS.register("tf.Relu6")
def _relu6(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    return ctx.one("Clip", [ctx.t(0), ctx.const(0.0, dt), ctx.const(6.0, dt)])


@TF_OPS.register("tf.GreaterEqual")
def _greater_equal(ctx: Ctx) -> Names:
    less = ctx.helper("Less", [ctx.t(0), ctx.t(1)], ctx.out_type())
    return ctx.one("Not", [less])


@TF_OPS.register("tf.NotEqual")
def _not_equal(ctx: Ctx) -> Names:
    # Embedding(mask_zero=True)'s mask: ONNX has no NotEqual, so Not(Equal)
    eq = ctx.helper("Equal", [ctx.t(0), ctx.t(1)], ctx.out_type())
    return ctx.one("Not", [eq])


@TF_OPS.register("tf.Cast")
def _cast(ctx: Ctx) -> Names:
    src, dst = ctx.in_type(0).dtype, ctx.out_type().dtype
    if src == dst:
        return [ctx.t(0)]
    return ctx.one("Cast", [ctx.t(0)], to=dst)


@TF_OPS.register("tf.Softmax", "tf.LogSoftmax")
def _softmax(ctx: Ctx) -> Names:
    op = "Softmax" if ctx.rec.op == "tf.Softmax" else "LogSoftmax"
    return ctx.one(op, [ctx.t(0)], axis=-1)


@TF_OPS.register("tf.SelectV2", "tf.Select")
def _select(ctx: Ctx) -> Names:
    cond = ctx.arg(0)
    if isinstance(cond, TArg) and cond.ref[0] == "r":
        try:
            return _dropout(ctx)
        except NotSupported:
            drawn = ctx.b.tape.draws.get(cond.ref)
            if drawn is None or drawn[0] != "bernoulli":
                raise
            return _random_select(ctx, drawn[1])
    return ctx.one("Where", [ctx.t(0), ctx.t(1), ctx.t(2)])


def _random_select(ctx: Ctx, p: float) -> Names:
    """SelectV2(draw, a, b) where the draw is True with probability p (Keras'
    RandomFlip: uniform <= 0.5, one per sample): the IR Dropout's keep mask
    of ratio 1 - p (the listener's mask() replays the recorded one) picks
    between a and b."""
    keep, out = ctx.in_type(0), ctx.out_type()
    shape = tuple(
        1 if k == 1 and o != 1 else o for k, o in zip(keep.shape, out.shape, strict=False)
    )
    if len(keep.shape) != len(out.shape):
        raise NotSupported("a random select whose draw has another rank than its values")
    ones = ctx.helper(
        "Expand",
        [ctx.const(1.0, out.dtype), ctx.dynamic_shape(list(shape))],
        TensorType(out.dtype, shape),
    )
    y, mask = ctx.node(
        "Dropout",
        [ones, ctx.const(1.0 - p, out.dtype), ctx.const(True, "bool")],
        outs=[TensorType(out.dtype, shape), TensorType("bool", shape)],
    )
    ctx.b.random_recs[y] = ctx.rec.index
    return ctx.one("Where", [mask, ctx.t(1), ctx.t(2)])


def _dropout(ctx: Ctx) -> Names:
    """Keras dropout: SelectV2(uniform >= rate, x * (1 / (1 - rate)), 0). The
    mask is random (from the seed generator): one IR Dropout(x, rate)."""
    scaled = ctx.t(1)
    mul = next((n for n in reversed(ctx.b.nodes) if scaled in n.outputs), None)
    if mul is None or mul.op != "Mul" or len(mul.inputs) != 2:
        raise NotSupported("a random select that is not Keras dropout")
    x, scale = mul.inputs
    scale_v = ctx.b.values.get(scale)
    if scale_v is None or scale_v.const is None or scale_v.const.data is None:
        raise NotSupported("dropout with a computed scale")
    keep_scale = float(
        scale_v.const.data if not isinstance(scale_v.const.data, list) else scale_v.const.data[0]
    )
    rate = 1.0 - 1.0 / keep_scale
    keep, out = ctx.in_type(0), ctx.out_type()
    # the draws' shape is concrete: a dim is the data's where it is not a broadcast 1
    shape = tuple(
        1 if k == 1 and o != 1 else o for k, o in zip(keep.shape, out.shape, strict=False)
    )
    if len(keep.shape) != len(out.shape) or shape == tuple(out.shape):
        return [ctx.dropout(x, rate, ctx.rec.index)]
    keep = TensorType(keep.dtype, shape)
    # a noise_shape mask (SpatialDropout, EfficientNet's stochastic depth): one draw
    # per [B, 1, 1, C] broadcast over x. The IR Dropout's mask has its data's shape, so
    # the Dropout runs on ones of the mask's shape, giving keep / (1 - rate), and x is
    # multiplied by that (x * keep * scale, as SelectV2 selects it)
    ones = ctx.helper(
        "Expand",
        [ctx.const(1.0, out.dtype), ctx.dynamic_shape(list(keep.shape))],
        TensorType(out.dtype, keep.shape),
    )
    y, _mask = ctx.node(
        "Dropout",
        [ones, ctx.const(rate, out.dtype), ctx.const(True, "bool")],
        outs=[TensorType(out.dtype, keep.shape), TensorType("bool", keep.shape)],
    )
    ctx.b.random_recs[y] = ctx.rec.index
    return ctx.one("Mul", [x, y])


# -- linear algebra ------------------------------------------------------------------------
@TF_OPS.register("tf.MatMul")
def _matmul(ctx: Ctx) -> Names:
    ta, tb = bool(attr(ctx, "transpose_a", False)), bool(attr(ctx, "transpose_b", False))
    if ta or tb:
        return ctx.one("Gemm", [ctx.t(0), ctx.t(1)], transA=int(ta), transB=int(tb))
    return ctx.one("MatMul", [ctx.t(0), ctx.t(1)])


@TF_OPS.register("tf.BatchMatMulV2", "tf.BatchMatMulV3")
def _batch_matmul(ctx: Ctx) -> Names:
    a, b = ctx.t(0), ctx.t(1)
    for k, flag in ((0, "adj_x"), (1, "adj_y")):
        if attr(ctx, flag, False):
            rank = len(ctx.in_type(k).shape)
            perm = list(range(rank - 2)) + [rank - 1, rank - 2]
            t = ctx.in_type(k)
            ty = TensorType(t.dtype, tuple(t.shape[p] for p in perm))
            name = ctx.helper("Transpose", [a if k == 0 else b], ty, perm=perm)
            a, b = (name, b) if k == 0 else (a, name)
    return ctx.one("MatMul", [a, b])


def _nhwc_op(
    ctx: Ctx, op: str, inputs: list[str], x_type: TensorType | None = None, **attrs: object
) -> Names:
    """Transpose channels-last -> channels-first (NHWC -> NCHW, NDHWC -> NCDHW),
    the ONNX op, Transpose back. x_type: the type of inputs[0] when it is not
    the record's argument 0."""
    xt = ctx.in_type(0) if x_type is None else x_type
    first, last = channels_first_perm(len(xt.shape)), channels_last_perm(len(xt.shape))
    x_nchw = ctx.helper("Transpose", [inputs[0]], _perm(xt, first), perm=first)
    out = ctx.out_type()
    y = ctx.helper(op, [x_nchw, *inputs[1:]], _perm(out, first), **attrs)
    return ctx.one("Transpose", [y], perm=last)


def channels_first_perm(rank: int) -> list[int]:
    """[0, rank - 1, 1, ..., rank - 2]: NHWC -> NCHW, NDHWC -> NCDHW."""
    return [0, rank - 1, *range(1, rank - 1)]


def channels_last_perm(rank: int) -> list[int]:
    """[0, 2, ..., rank - 1, 1]: the inverse of channels_first_perm."""
    return [0, *range(2, rank), 1]


def _perm(ty: TensorType, perm: list[int]) -> TensorType:
    return TensorType(ty.dtype, tuple(ty.shape[p] for p in perm))


def _same_pads(
    in_hw: Sequence[int | str], k: list[int], s: list[int], d: list[int], batch: int | None
) -> list[int]:
    """TensorFlow's SAME padding: the extra pixel goes at the end. A spatial
    size marked `batch` only equals the batch size by chance: use its value."""
    begin, end = [], []
    for size, kk, ss, dd in zip(in_hw, k, s, d, strict=True):
        if not isinstance(size, int):
            if batch is None:
                raise NotSupported("SAME padding over a symbolic axis")
            size = batch
        total = max((-(-size // ss) - 1) * ss + (kk - 1) * dd + 1 - size, 0)
        begin.append(total // 2)
        end.append(total - total // 2)
    return begin + end


def _padding(
    ctx: Ctx, k: list[int], s: list[int], d: list[int], x_type: TensorType | None = None
) -> list[int]:
    """ONNX pads (begins, then ends) of an N-d channels-last TF op, from its
    padding attribute and the spatial sizes of x_type (default: argument 0)."""
    n = len(k)
    mode = attr(ctx, "padding", b"VALID")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode == "VALID":
        return [0] * (2 * n)
    if mode == "SAME":
        xt = ctx.in_type(0) if x_type is None else x_type
        return _same_pads(xt.shape[1 : 1 + n], k, s, d, ctx.batch)
    if mode == "EXPLICIT":
        p = attr_ints(ctx, "explicit_paddings")  # (begin, end) per axis, N first
        return [p[2 + 2 * i] for i in range(n)] + [p[3 + 2 * i] for i in range(n)]
    raise NotSupported(f"padding {mode}")


def _nhwc_attr(ctx: Ctx, name: str) -> list[int]:
    """A per-axis attribute (strides, dilations, ksize) of an N-d channels-last
    op: its spatial entries."""
    v = attr_ints(ctx, name, (1, 1, 1, 1))
    if attr(ctx, "data_format", b"NHWC") not in (b"NHWC", "NHWC", b"NDHWC", "NDHWC"):
        raise NotSupported("a channels-first data format")
    return v[1:-1]


@TF_OPS.register("tf.Conv2D", "tf.Conv3D")
def _conv2d(ctx: Ctx) -> Names:
    w = ctx.in_type(1)  # HWIO, DHWIO
    n = len(w.shape) - 2
    to_oihw = [n + 1, n, *range(n)]
    w_oihw = ctx.helper("Transpose", [ctx.t(1)], _perm(w, to_oihw), perm=to_oihw)
    groups = int(ctx.in_type(0).shape[-1]) // int(w.shape[n])
    return _nhwc_conv(ctx, w_oihw, [int(x) for x in w.shape[:n]], groups)


def _nhwc_conv(ctx: Ctx, w_oihw: str, k: list[int], group: int) -> Names:
    """An NHWC TF convolution as an ONNX Conv between transposes."""
    s, d = _nhwc_attr(ctx, "strides"), _nhwc_attr(ctx, "dilations")
    return _nhwc_op(
        ctx,
        "Conv",
        [ctx.t(0), w_oihw],
        kernel_shape=k,
        strides=s,
        pads=_padding(ctx, k, s, d),
        dilations=d,
        group=group,
    )


@TF_OPS.register("tf.DepthwiseConv2dNative")
def _depthwise(ctx: Ctx) -> Names:
    w = ctx.in_type(1)  # H W C M
    kh, kw, c, m = (int(x) for x in w.shape)
    # HWCM -> (C*M) 1 H W
    hw_cm = ctx.helper(
        "Reshape", [ctx.t(1), ctx.ints([kh, kw, 1, c * m])], TensorType(w.dtype, (kh, kw, 1, c * m))
    )
    w_oihw = ctx.helper(
        "Transpose", [hw_cm], TensorType(w.dtype, (c * m, 1, kh, kw)), perm=[3, 2, 0, 1]
    )
    return _nhwc_conv(ctx, w_oihw, [kh, kw], c)


def _pool(op: str) -> Converter:
    def rule(ctx: Ctx) -> Names:
        k = _nhwc_attr(ctx, "ksize")
        s = _nhwc_attr(ctx, "strides")
        pads = _padding(ctx, k, s, [1] * len(k))
        extra: dict[str, Any] = {"count_include_pad": 0} if op == "AveragePool" else {}
        return _nhwc_op(ctx, op, [ctx.t(0)], kernel_shape=k, strides=s, pads=pads, **extra)

    return rule


TF_OPS.add("tf.MaxPool", _pool("MaxPool"))
TF_OPS.add("tf.AvgPool", _pool("AveragePool"))


# -- reductions and shapes ------------------------------------------------------------------
def const_array(ctx: Ctx, i: int) -> np.ndarray | None:
    """Argument i's value where it is known when recording: a tensor created
    eagerly (a tape constant), or the output of an op this table folded to a
    constant (Range, Pack of constants); None for a computed tensor."""
    a = ctx.arg(i)
    if not isinstance(a, TArg):
        return None
    if a.ref[0] == "c":
        return np.asarray(ctx.b.to_numpy(ctx.b.tape.consts[a.ref[1]].tensor))
    if a.ref[0] == "o":
        v = ctx.b.values.get(ctx.b.names.get(a.ref) or "")
        if v is not None and v.kind == "const" and v.const is not None and v.const.data is not None:
            return np.asarray(v.const.data, dtype=np.dtype(v.type.dtype)).reshape(
                [int(d) for d in v.type.shape]
            )
    return None


def _axes_of(ctx: Ctx, i: int) -> list[int]:
    arr = const_array(ctx, i)
    if arr is None:
        raise NotSupported("axes computed at run time")
    return [int(x) for x in list(arr.reshape(-1))]


def _reduce(op: str, ctx: Ctx) -> Names:
    keep = int(bool(attr(ctx, "keep_dims", False)))
    return ctx.one(op, [ctx.t(0), ctx.ints(_axes_of(ctx, 1))], keepdims=keep)


for _tf, _op in {
    "Mean": "ReduceMean",
    "Sum": "ReduceSum",
    "Max": "ReduceMax",
    "Min": "ReduceMin",
    "Prod": "ReduceProd",
}.items():
    TF_OPS.add(f"tf.{_tf}", partial(_reduce, _op))


@TF_OPS.register("tf.Squeeze")
def _squeeze(ctx: Ctx) -> Names:
    dims = attr_ints(ctx, "squeeze_dims")
    if not dims:
        dims = [i for i, d in enumerate(ctx.in_type(0).shape) if d == 1]
    return ctx.one("Squeeze", [ctx.t(0), ctx.ints(dims)])


@TF_OPS.register("tf.ExpandDims")
def _expand_dims(ctx: Ctx) -> Names:
    return ctx.one("Unsqueeze", [ctx.t(0), ctx.ints(_axes_of(ctx, 1))])


@TF_OPS.register("tf.Reshape")
def _reshape(ctx: Ctx) -> Names:
    out = ctx.out_type()
    known = const_array(ctx, 0)
    if known is not None and not any(isinstance(d, str) for d in out.shape):
        # a constant reshaped (tf.repeat's repeats, to a scalar for a Tile's
        # multiples): a constant, so that the ops reading it can fold too
        return [ctx.const(known.reshape([int(d) for d in out.shape]), out.dtype)]
    return ctx.one("Reshape", [ctx.t(0), ctx.shape_const(list(out.shape))])


@TF_OPS.register("tf.Transpose")
def _transpose(ctx: Ctx) -> Names:
    return ctx.one("Transpose", [ctx.t(0)], perm=_axes_of(ctx, 1))


@TF_OPS.register("tf.ReverseV2")
def _reverse(ctx: Ctx) -> Names:
    # ONNX has no Reverse: a Slice with step -1 along each axis (Bidirectional's flip)
    axes = _axes_of(ctx, 1)
    big = 2**62
    inputs = [ctx.ints([-1] * len(axes)), ctx.ints([-big] * len(axes)), ctx.ints(axes)]
    return ctx.one("Slice", [ctx.t(0), *inputs, ctx.ints([-1] * len(axes))])


@TF_OPS.register("tf.ConcatV2")
def _concat(ctx: Ctx) -> Names:
    n = len(ctx.rec.args) - 1
    axis = _axes_of(ctx, n)[0]
    folded = _folded(ctx, lambda *xs: np.concatenate(xs, axis=axis), n)
    return folded or ctx.one("Concat", [ctx.t(i) for i in range(n)], axis=axis)


@TF_OPS.register("tf.Shape")
def _shape(ctx: Ctx) -> Names:
    dt = ctx.out_type().dtype
    s = ctx.helper("Shape", [ctx.t(0)], TensorType("int64", ctx.out_type().shape))
    return [s] if dt == "int64" else ctx.one("Cast", [s], to=dt)


@TF_OPS.register("tf.Pad", "tf.PadV2")
def _pad(ctx: Ctx) -> Names:
    a = ctx.arg(1)
    if not isinstance(a, TArg) or a.ref[0] != "c":
        raise NotSupported("paddings computed at run time")
    p = ctx.b.to_numpy(ctx.b.tape.consts[a.ref[1]].tensor).reshape(-1, 2)
    pads = [int(x) for x in p[:, 0]] + [int(x) for x in p[:, 1]]
    ins = [ctx.t(0), ctx.ints(pads)]
    if ctx.rec.op == "tf.PadV2":
        ins.append(ctx.t(2))
    return ctx.one("Pad", ins, mode="constant")


@TF_OPS.register("tf.GatherV2", "tf.ResourceGather")
def _gather(ctx: Ctx) -> Names:
    axis = _axes_of(ctx, 2)[0] if ctx.rec.op == "tf.GatherV2" else 0
    batch_dims = attr_int(ctx, "batch_dims", 0)
    if batch_dims:
        # each leading row gathers from its own row (keras.ops.take_along_axis:
        # [N, M] by [N, K] indices): GatherElements where the indices have the
        # data's rank and the gathered axis follows the batch dims
        xt, it = ctx.in_type(0), ctx.in_type(1)
        rank = len(xt.shape)
        if axis % rank != batch_dims or len(it.shape) != rank or rank != batch_dims + 1:
            raise NotSupported(f"a gather with batch_dims={batch_dims} of other shapes")
        return ctx.one("GatherElements", [ctx.t(0), ctx.t(1)], axis=batch_dims)
    return ctx.one("Gather", [ctx.t(0), ctx.t(1)], axis=axis)


@TF_OPS.register("tf.Einsum")
def _einsum(ctx: Ctx) -> Names:
    n = len(ctx.rec.args)
    return ctx.one("Einsum", [ctx.t(i) for i in range(n)], equation=str(attr(ctx, "equation")))


@TF_OPS.register("tf.Erfc")
def _erfc(ctx: Ctx) -> Names:
    # 1 - erf(x): ONNX has no erfc (Keras' exact gelu is 0.5 x erfc(-x / sqrt 2))
    erf = ctx.helper("Erf", [ctx.t(0)], ctx.out_type())
    return ctx.one("Sub", [ctx.const(1.0, ctx.out_type().dtype), erf])


@TF_OPS.register("tf.Atan2")
def _atan2(ctx: Ctx) -> Names:
    return ctx.one("Atan2", [ctx.t(0), ctx.t(1)], domain="tracelog")


@TF_OPS.register("tf.Erfinv")
def _erfinv(ctx: Ctx) -> Names:
    return ctx.one("Erfinv", [ctx.t(0)], domain="tracelog")


@TF_OPS.register("tf.Ndtri")
def _ndtri(ctx: Ctx) -> Names:
    return ctx.one("Ndtri", [ctx.t(0)], domain="tracelog")


# the modified Bessel functions of the first kind, orders 0 and 1, and their
# exponentially scaled forms (tf.math.bessel_i0 ... bessel_i1e)
def _tracelog_unary(op: str, ctx: Ctx) -> Names:
    return ctx.one(op, [ctx.t(0)], domain="tracelog")


for _tf_op, _op in (
    ("tf.BesselI0", "I0"),
    ("tf.BesselI0e", "I0e"),
    ("tf.BesselI1", "I1"),
    ("tf.BesselI1e", "I1e"),
):
    TF_OPS.add(_tf_op, partial(_tracelog_unary, _op))


@TF_OPS.register("tf.Lgamma")
def _lgamma(ctx: Ctx) -> Names:
    return ctx.one("Lgamma", [ctx.t(0)], domain="tracelog")


@TF_OPS.register("tf.Digamma")
def _digamma(ctx: Ctx) -> Names:
    return ctx.one("Digamma", [ctx.t(0)], domain="tracelog")


@TF_OPS.register("tf.Polygamma")
def _polygamma(ctx: Ctx) -> Names:
    # tf.math.polygamma(a, x) with a constant order: 0 is digamma, 1 trigamma
    a = const_array(ctx, 0)
    ops = {0.0: "Digamma", 1.0: "Trigamma"}
    order = float(a.flat[0]) if a is not None and a.size else None
    if a is None or order not in ops or not np.all(a == order):
        raise NotSupported("polygamma of a computed order, or of order 2 and up")
    x = ctx.t(1)
    if tuple(ctx.out_type().shape) != tuple(ctx.arg(1).shape):
        raise NotSupported("polygamma whose order broadcasts x")
    return ctx.one(ops[order], [x], domain="tracelog")


# -- the rounding divisions and remainders, as TensorFlow's kernels compute them
# (tensorflow/core/kernels/cwise_ops.h): TruncateMod is C's fmod (ONNX Mod, fmod=1);
# FloorMod is fmod corrected by the signs (integers: ONNX Mod); FloorDiv is floor(x / y)
# for floats (not Python's x // y) and the truncated quotient less 1 where the signs
# differ and it is not exact for integers; TruncateDiv truncates.
@TF_OPS.register("tf.TruncateMod")
def _truncate_mod(ctx: Ctx) -> Names:
    return ctx.one("Mod", [ctx.t(0), ctx.t(1)], fmod=1)


@TF_OPS.register("tf.FloorMod")
def _floor_mod(ctx: Ctx) -> Names:
    return [floor_mod_of(ctx, ctx.t(0), ctx.t(1), ctx.out_type())]


@TF_OPS.register("tf.FloorDiv")
def _floor_div(ctx: Ctx) -> Names:
    x, y, out = ctx.t(0), ctx.t(1), ctx.out_type()
    if not is_int(out.dtype):
        return ctx.one("Floor", [ctx.helper("Div", [x, y], out)])
    return [int_floor_div_of(ctx, x, y, out)]


@TF_OPS.register("tf.TruncateDiv")
def _truncate_div(ctx: Ctx) -> Names:
    x, y, out = ctx.t(0), ctx.t(1), ctx.out_type()
    if is_int(out.dtype):
        return ctx.one("Div", [x, y])
    return [trunc_of(ctx, ctx.helper("Div", [x, y], out), out)]


@TF_OPS.register("tf.Log1p")
def _log1p(ctx: Ctx) -> Names:
    # tracelog.Log1p: log(1 + x) written out loses x's digits below 1's resolution
    return ctx.one("Log1p", [ctx.t(0)], domain="tracelog")


@TF_OPS.register("tf.ZerosLike", "tf.OnesLike")
def _fill_like(ctx: Ctx) -> Names:
    ty = ctx.out_type()
    value = 0 if ctx.rec.op == "tf.ZerosLike" else 1
    scalar = ctx.const(bool(value) if ty.dtype == "bool" else value, ty.dtype)
    shape = ctx.helper("Shape", [ctx.t(0)], TensorType("int64", (len(ty.shape),)))
    return ctx.one("Expand", [scalar, shape])


def _strided_spec(
    ctx: Ctx, begin: list[int], end: list[int], strides: list[int], rank: int
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    """A StridedSlice's spec as Slice inputs (starts, ends, axes, steps), the
    input axes it shrinks and the output axes it inserts."""
    mask = {k: attr_int(ctx, f"{k}_mask", 0) for k in ("begin", "end", "shrink_axis", "ellipsis")}
    new_axis = attr_int(ctx, "new_axis_mask", 0)
    named = sum(1 for k in range(len(begin)) if not (mask["ellipsis"] | new_axis) >> k & 1)
    big = 2**62
    starts, ends, axes, steps, shrunk, inserted = [], [], [], [], [], []
    ax = out_ax = 0  # the input axis and the output axis entry k stands for
    for k, (b, e, st) in enumerate(zip(begin, end, strides, strict=True)):
        if mask["ellipsis"] >> k & 1:
            ax, out_ax = ax + rank - named, out_ax + rank - named
            continue
        if new_axis >> k & 1:
            inserted.append(out_ax)
            out_ax += 1
            continue
        if mask["shrink_axis"] >> k & 1:  # one index, the axis then squeezed
            e, st = (b + 1 if b != -1 else big), 1
            shrunk.append(ax)
        else:
            b = (big - 1 if st < 0 else 0) if mask["begin"] >> k & 1 else b
            e = (-big if st < 0 else big) if mask["end"] >> k & 1 else e
            out_ax += 1
        starts.append(b)
        ends.append(e)
        axes.append(ax)
        steps.append(st)
        ax += 1
    if ax > rank:
        raise NotSupported(f"StridedSlice of {len(begin)} entries on rank {rank}")
    return starts, ends, axes, steps, shrunk, inserted


@TF_OPS.register("tf.StridedSlice")
def _strided_slice(ctx: Ctx) -> Names:
    """Constant begin/end/strides: Slice, then Squeeze for shrunk axes and
    Unsqueeze for new ones. Entry k of the spec is the ellipsis (the input
    axes no other entry names, whole), a new axis of size 1, one index
    (shrunk), or a range (begin_mask/end_mask: from the start, to the end);
    axes after the spec are whole (tensorflow/core/util/strided_slice_op.cc)."""
    bounds = []
    for i in (1, 2, 3):
        a = ctx.arg(i)
        if not isinstance(a, TArg) or a.ref[0] != "c":
            raise NotSupported("StridedSlice bounds computed at run time")
        bounds.append(
            [int(x) for x in ctx.b.to_numpy(ctx.b.tape.consts[a.ref[1]].tensor).reshape(-1)]
        )
    begin, end, strides = bounds
    rank = len(ctx.in_type(0).shape)
    starts, ends, axes, steps, shrunk, inserted = _strided_spec(ctx, begin, end, strides, rank)
    out = ctx.out_type()
    # the shape after Slice: the output's dims with the new axes out, the shrunk in
    dims = [d for i, d in enumerate(out.shape) if i not in inserted]
    for a in shrunk:
        dims.insert(a, 1)
    steps_in = [ctx.t(0), ctx.ints(starts), ctx.ints(ends), ctx.ints(axes), ctx.ints(steps)]
    whole = all((b, e, st) == (0, 2**62, 1) for b, e, st in zip(starts, ends, steps, strict=True))
    # a spec of only the ellipsis and new axes (mask[None, None]) slices nothing
    stages: list[tuple[str, list[int]]] = [] if whole and not shrunk else [("Slice", [])]
    if shrunk:
        stages.append(("Squeeze", shrunk))
    if inserted:
        stages.append(("Unsqueeze", inserted))
    if not stages:
        return [ctx.t(0)]
    cur = ctx.t(0)
    for k, (op, which) in enumerate(stages):
        ins = steps_in if op == "Slice" else [cur, ctx.ints(which)]
        if k == len(stages) - 1:
            return ctx.one(op, ins)
        if op == "Squeeze":
            dims = [d for i, d in enumerate(dims) if i not in shrunk]
        cur = ctx.helper(op, ins, TensorType(out.dtype, tuple(dims)))
    raise AssertionError("unreachable")


# -- losses ---------------------------------------------------------------------------------
@TF_OPS.register("tf.SparseSoftmaxCrossEntropyWithLogits")
def _sparse_xent(ctx: Ctx) -> Names:
    logits = ctx.in_type(0)
    logp = ctx.helper("LogSoftmax", [ctx.t(0)], logits, axis=-1)
    labels = _same_dtype(ctx, 1, "int64")
    loss = ctx.node("NegativeLogLikelihoodLoss", [logp, labels], outs=1, reduction="none")
    return [loss[0], None]


@TF_OPS.register("tf.SoftmaxCrossEntropyWithLogits")
def _xent(ctx: Ctx) -> Names:
    # -sum(labels * log_softmax(logits), axis=-1)
    logits = ctx.in_type(0)
    logp = ctx.helper("LogSoftmax", [ctx.t(0)], logits, axis=-1)
    prod = ctx.helper("Mul", [ctx.t(1), logp], logits)
    s = ctx.helper("ReduceSum", [prod, ctx.ints([-1])], ctx.out_type(), keepdims=0)
    return [ctx.one("Neg", [s])[0], None]


TF_OPS.not_yet(
    "tf.FusedBatchNormV3",
    reason="fused batch norm (Keras 3 writes batch norm as arithmetic instead)",
)


from tracelog.adapters.tensorflow import dilated, layer_rules  # noqa: E402,F401  (fill TF_OPS)


# -- dense linear algebra (tf.linalg): the IR ops torch.linalg records as ----------------------
def _adjointed(ctx: Ctx, i: int) -> str:
    """Input ``i`` with its last two dims swapped (real dtypes: the adjoint)."""
    ty = ctx.in_type(i)
    rank = len(ty.shape)
    turned = TensorType(ty.dtype, (*ty.shape[:-2], ty.shape[-1], ty.shape[-2]))
    return ctx.helper("Transpose", [ctx.t(i)], turned, perm=[*range(rank - 2), rank - 1, rank - 2])


@TF_OPS.register("tf.MatrixInverse")
def _matrix_inverse(ctx: Ctx) -> Names:
    # adjoint: the inverse of A's adjoint
    a = _adjointed(ctx, 0) if attr(ctx, "adjoint", False) else ctx.t(0)
    return ctx.one("Inverse", [a], domain="tracelog")


@TF_OPS.register("tf.MatrixSolve")
def _matrix_solve(ctx: Ctx) -> Names:
    # adjoint: A^T X = B
    a = _adjointed(ctx, 0) if attr(ctx, "adjoint", False) else ctx.t(0)
    return ctx.one("Solve", [a, ctx.t(1)], domain="tracelog")


@TF_OPS.register("tf.MatrixDeterminant")
def _matrix_determinant(ctx: Ctx) -> Names:
    return ctx.one("Det", [ctx.t(0)])


@TF_OPS.register("tf.LogMatrixDeterminant")
def _log_matrix_determinant(ctx: Ctx) -> Names:
    # (sign, log |det|)
    return ctx.node("SlogDet", [ctx.t(0)], outs=2, domain="tracelog")


@TF_OPS.register("tf.Cholesky")
def _cholesky(ctx: Ctx) -> Names:
    return ctx.one("Cholesky", [ctx.t(0)], domain="tracelog")


@TF_OPS.register("tf.MatrixTriangularSolve")
def _matrix_triangular_solve(ctx: Ctx) -> Names:
    # lower (default True) reads A's lower triangle; adjoint solves A^T X = B,
    # A^T triangular the other way
    upper = not bool(attr(ctx, "lower", True))
    a = ctx.t(0)
    if attr(ctx, "adjoint", False):
        a, upper = _adjointed(ctx, 0), not upper
    return ctx.one("SolveTriangular", [a, ctx.t(1)], domain="tracelog", upper=int(upper))
